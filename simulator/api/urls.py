from rest_framework.routers import SimpleRouter

from simulator.api.views import WhatIfViewSet

router = SimpleRouter()
router.register("whatif", WhatIfViewSet, basename="whatif")
urlpatterns = router.urls
