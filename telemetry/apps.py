from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "telemetry"

    def ready(self):
        from controlplane import navigation
        from jobs import hooks
        from telemetry import schema  # noqa: F401  (registers the agent token scheme with drf-spectacular)
        from telemetry.links import links_clean
        from telemetry.services.prediction import precision_in_band

        hooks.register_precision(precision_in_band)
        hooks.register_links_clean(links_clean)

        navigation.register("Fabric", "fabric-index", audience="all", order=23)
        navigation.register("Predictions", "prediction-list-page", audience="provider", order=65)
