from django.urls import path
from rest_framework.routers import SimpleRouter

from telemetry.api.views import (
    AgentTokenViewSet,
    AlertmanagerWebhookView,
    JobDiagnosisView,
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
    path("jobs/<int:pk>/diagnosis/", JobDiagnosisView.as_view(), name="job-diagnosis"),
    *router.urls,
]
