from django.apps import AppConfig


class ControlplaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Control plane"

    def ready(self):
        from controlplane import data, navigation, wsauth

        data.check()  # the public data files every process reads: a clear start-up error where one is missing

        navigation.register("Home", "home", audience="all", order=0)
        navigation.register("Audit", "audit-list", audience="audit", order=90)
        wsauth.connect_signals()
