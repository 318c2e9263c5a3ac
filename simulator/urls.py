from django.urls import path

from simulator import views

urlpatterns = [
    path("whatif/", views.whatif_list, name="whatif-list-page"),
    path("whatif/<int:pk>/", views.whatif_detail, name="whatif-detail"),
    path("scenarios/", views.scenario_list, name="scenario-list"),
    path("scenarios/<int:pk>/", views.scenario_detail, name="scenario-detail"),
]
