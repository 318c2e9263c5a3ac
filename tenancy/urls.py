from django.conf import settings
from django.urls import include, path
from django.views.generic import RedirectView

from tenancy import views

urlpatterns = [
    # The rate-limited login form (controlplane/urls.py keeps logout); the admin site logs in through it too.
    path("accounts/login/", views.LoginView.as_view(), name="login"),
    path("admin/login/", RedirectView.as_view(pattern_name="login", query_string=True)),
    path("tokens/", views.token_list, name="token-list"),
    path("tokens/<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
    path("users/", views.user_list, name="user-list"),
    path("users/<int:pk>/remove/", views.user_remove, name="user-remove"),
    path("users/<int:pk>/role/", views.user_role, name="user-role"),
    path("users/<int:pk>/password/", views.user_password_reset, name="user-password-reset"),
]

# Single sign-on (tenancy/sso.py): the provider's login and its redirect back, only where it is configured.
if settings.SSO_ENABLED:
    urlpatterns.append(path("oidc/", include("mozilla_django_oidc.urls")))
