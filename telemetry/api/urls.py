from django.urls import path
from rest_framework.routers import SimpleRouter

from telemetry.api.views import (
    AgentTokenViewSet,
    AlertmanagerWebhookView,
    NotificationChannelViewSet,
    NotificationDeliveryViewSet,
    PredictionViewSet,
    TelemetryIngestView,
)

router = SimpleRouter()
router.register("agent-tokens", AgentTokenViewSet, basename="agent-token")
router.register("notification-channels", NotificationChannelViewSet, basename="notification-channel")
router.register("notification-deliveries", NotificationDeliveryViewSet, basename="notification-delivery")
router.register("predictions", PredictionViewSet, basename="prediction")

urlpatterns = [
    path("ingest/telemetry/", TelemetryIngestView.as_view(), name="ingest-telemetry"),
    path("ingest/alertmanager/", AlertmanagerWebhookView.as_view(), name="ingest-alertmanager"),
    *router.urls,
]
