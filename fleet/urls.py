from django.urls import path

from fleet import views, views_actions, views_versions

urlpatterns = [
    path("fleet/", views.FleetOverviewView.as_view(), name="fleet-overview"),
    path("clusters/", views.ClusterListView.as_view(), name="fleet-clusters"),
    path("clusters/<int:pk>/", views.cluster_detail, name="fleet-cluster"),
    path("clusters/<int:pk>/reconcile/", views.cluster_reconcile_view, name="fleet-cluster-reconcile"),
    path("blueprints/", views.blueprint_list, name="fleet-blueprints"),
    path("blueprints/<int:pk>/", views.blueprint_detail, name="fleet-blueprint"),
    path("blueprints/import/", views_versions.blueprint_import, name="fleet-blueprint-import"),
    path("blueprints/<int:pk>/versions/new/", views_versions.version_new, name="fleet-version-new"),
    path(
        "blueprints/<int:pk>/versions/<int:number>/activate/",
        views_versions.version_activate,
        name="fleet-version-activate",
    ),
    path("rollouts/", views.RolloutListView.as_view(), name="fleet-rollouts"),
    path("rollouts/new/", views_actions.rollout_new, name="fleet-rollout-new"),
    path("rollouts/<int:pk>/", views.rollout_detail, name="fleet-rollout"),
    path("rollouts/<int:pk>/<slug:action>/", views.rollout_action, name="fleet-rollout-action"),
    path("clusters/<int:pk>/blueprint/", views_actions.cluster_assign_view, name="fleet-cluster-assign"),
    path("nodes/<int:pk>/<slug:action>/", views_actions.node_action, name="fleet-node-action"),
    path("drift/", views.DriftListView.as_view(), name="fleet-drift"),
    path("drift/sweep/", views_actions.drift_sweep_view, name="fleet-drift-sweep"),
    path("automation/", views_actions.automation_view, name="fleet-automation"),
]
