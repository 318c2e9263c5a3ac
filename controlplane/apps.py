from django.apps import AppConfig


class ControlplaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Control plane"

    def ready(self):
        from controlplane import navigation, wsauth

        navigation.register("Home", "home", audience="all", order=0)
        navigation.register("Audit", "audit-list", audience="audit", order=90)
        wsauth.connect_signals()
