from django.urls import path

from fleet import views

urlpatterns = [
    path("fleet/", views.FleetOverviewView.as_view(), name="fleet-overview"),
    path("clusters/", views.ClusterListView.as_view(), name="fleet-clusters"),
    path("clusters/<int:pk>/", views.cluster_detail, name="fleet-cluster"),
    path("clusters/<int:pk>/reconcile/", views.cluster_reconcile_view, name="fleet-cluster-reconcile"),
    path("blueprints/", views.blueprint_list, name="fleet-blueprints"),
    path("blueprints/<int:pk>/", views.blueprint_detail, name="fleet-blueprint"),
    path("rollouts/", views.RolloutListView.as_view(), name="fleet-rollouts"),
    path("rollouts/<int:pk>/", views.rollout_detail, name="fleet-rollout"),
    path("rollouts/<int:pk>/<slug:action>/", views.rollout_action, name="fleet-rollout-action"),
    path("drift/", views.DriftListView.as_view(), name="fleet-drift"),
]
