from django.urls import path

from telemetry import views

urlpatterns = [path("predictions/", views.prediction_overview, name="prediction-list-page")]
