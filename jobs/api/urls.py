from rest_framework.routers import SimpleRouter

from jobs.api import views

router = SimpleRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("incidents", views.IncidentViewSet, basename="incident")
router.register("faults", views.FaultViewSet, basename="fault")
router.register("actions", views.RecoveryActionViewSet, basename="action")
router.register("stats", views.StatsViewSet, basename="stats")

urlpatterns = router.urls
