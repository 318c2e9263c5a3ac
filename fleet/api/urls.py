from django.urls import path
from rest_framework.routers import SimpleRouter

from fleet.api.views_automation import AutomationSwitchView
from fleet.api.views_blueprints import BlueprintViewSet
from fleet.api.views_clusters import ClusterViewSet, FleetViewSet, NodeViewSet
from fleet.api.views_rollouts import DriftFindingViewSet, RolloutViewSet
from fleet.api.views_sources import BlueprintSourceWebhookView

router = SimpleRouter()
router.register("fleets", FleetViewSet, basename="fleet")
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("nodes", NodeViewSet, basename="node")
router.register("blueprints", BlueprintViewSet, basename="blueprint")
router.register("rollouts", RolloutViewSet, basename="rollout")
router.register("drift", DriftFindingViewSet, basename="drift")

urlpatterns = [
    *router.urls,
    path("automation/", AutomationSwitchView.as_view(), name="automation"),
    path(
        "blueprint-sources/<int:source_id>/webhook/",
        BlueprintSourceWebhookView.as_view(),
        name="blueprint-source-webhook",
    ),
]
