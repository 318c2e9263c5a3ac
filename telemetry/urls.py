from django.urls import path

from telemetry import views

urlpatterns = [
    path("predictions/", views.prediction_overview, name="prediction-list-page"),
    path("fabric/<int:cluster_id>/", views.fabric_view, name="fabric"),
]
