from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "telemetry"

    def ready(self):
        from controlplane import navigation

        navigation.register("Predictions", "prediction-list-page", audience="provider", order=65)
