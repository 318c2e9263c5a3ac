from rest_framework.routers import SimpleRouter

from tenancy.api.views import ApiTokenViewSet, TenantViewSet, UserViewSet

router = SimpleRouter()
router.register("tenants", TenantViewSet, basename="tenant")
router.register("tokens", ApiTokenViewSet, basename="token")
router.register("users", UserViewSet, basename="user")

urlpatterns = router.urls
