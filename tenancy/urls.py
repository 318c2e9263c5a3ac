from django.urls import path

from tenancy import views

urlpatterns = [
    path("tokens/", views.token_list, name="token-list"),
    path("tokens/<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
]
