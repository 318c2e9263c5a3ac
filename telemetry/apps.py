from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "telemetry"

    def ready(self):
        from controlplane import navigation
        from telemetry import schema  # noqa: F401  (registers the agent token scheme with drf-spectacular)

        navigation.register("Predictions", "prediction-list-page", audience="provider", order=65)
