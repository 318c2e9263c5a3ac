from django.urls import path

from jobs import views

urlpatterns = [
    path("jobs/", views.JobListView.as_view(), name="job-list"),
    path("jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("faults/", views.fault_overview, name="fault-overview"),
]
