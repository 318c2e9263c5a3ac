from django.urls import path

from jobs.home import home

urlpatterns = [path("", home, name="home")]
