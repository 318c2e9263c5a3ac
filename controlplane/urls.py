from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from controlplane import api_views, health, views

router = DefaultRouter()
router.register("events", api_views.EventViewSet, basename="event")
router.register("audit", api_views.AuditEntryViewSet, basename="audit")

# A page in the site's layout, or JSON under /api/, with DEBUG on or off (controlplane/error_pages.py).
handler400 = "controlplane.error_pages.bad_request"
handler403 = "controlplane.error_pages.permission_denied"
handler404 = "controlplane.error_pages.page_not_found"
handler500 = "controlplane.error_pages.server_error"

urlpatterns = [
    path("", include("home.urls")),
    path("audit/", views.AuditEntryListView.as_view(), name="audit-list"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", include("telemetry.metrics_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's start-up script as a file, so the page keeps the CSP (no inline script).
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="swagger-ui"),
    # API route names live in the "api" namespace so they never collide with page names.
    path(
        "api/v1/",
        include(
            (
                [
                    *router.urls,
                    path("", include("tenancy.api.urls")),
                    path("", include("fleet.api.urls")),
                    path("", include("telemetry.api.urls")),
                    path("", include("simulator.api.urls")),
                    path("", include("jobs.api.urls")),
                    path("", include("jobs.launcher_api")),
                ],
                "api",
            )
        ),
    ),
    path("", include("tenancy.urls")),
    path("", include("simulator.urls")),
    path("", include("telemetry.urls")),
    path("", include("fleet.urls")),
    path("", include("jobs.urls")),
    path("admin/", admin.site.urls),
]
