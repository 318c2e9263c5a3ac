from django.apps import AppConfig


class SimulatorConfig(AppConfig):
    name = "simulator"

    def ready(self):
        from controlplane import navigation

        navigation.register("What-if", "whatif-list-page", audience="provider", order=70)
        navigation.register("Scenarios", "scenario-list", audience="provider", order=71)
