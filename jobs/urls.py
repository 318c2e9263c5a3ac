from django.urls import path

from jobs import views

urlpatterns = [
    path("jobs/", views.JobListView.as_view(), name="job-list"),
    path("jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("jobs/<int:pk>/cancel/", views.job_cancel, name="job-cancel"),
    path("faults/", views.fault_overview, name="fault-overview"),
    path("incidents/<int:pk>/", views.incident_detail, name="incident-detail"),
    path("nodes/<int:pk>/", views.node_detail, name="node-detail"),
    path("search/", views.search, name="search"),
]
