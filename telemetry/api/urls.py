from django.urls import path
from rest_framework.routers import SimpleRouter

from telemetry.api.views import AgentTokenViewSet, TelemetryIngestView

router = SimpleRouter()
router.register("agent-tokens", AgentTokenViewSet, basename="agent-token")

urlpatterns = [
    path("ingest/telemetry/", TelemetryIngestView.as_view(), name="ingest-telemetry"),
    *router.urls,
]
