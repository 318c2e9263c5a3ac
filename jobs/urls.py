from django.urls import path, re_path

from jobs import views, views_incidents

urlpatterns = [
    path("jobs/", views.JobListView.as_view(), name="job-list"),
    path("jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("jobs/<int:pk>/cancel/", views.job_cancel, name="job-cancel"),
    path("faults/", views.fault_overview, name="fault-overview"),
    path("incidents/", views_incidents.IncidentListView.as_view(), name="incident-list"),
    path("incidents/<int:pk>/", views.incident_detail, name="incident-detail"),
    re_path(
        r"^incidents/(?P<pk>[0-9]+)/(?P<action>acknowledge|assign|note|resolve|reopen)/$",
        views_incidents.incident_act,
        name="incident-act",
    ),
    path("nodes/<int:pk>/", views.node_detail, name="node-detail"),
    path("search/", views.search, name="search"),
]
