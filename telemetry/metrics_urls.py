from django.urls import path

from telemetry.api.views import MetricsView

urlpatterns = [path("", MetricsView.as_view(), name="metrics")]
