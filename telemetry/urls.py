from django.urls import path

from telemetry import views

urlpatterns = [
    path("predictions/", views.prediction_overview, name="prediction-list-page"),
    path("fabric/", views.fabric_index, name="fabric-index"),
    path("fabric/<int:cluster_id>/", views.fabric_view, name="fabric"),
]
