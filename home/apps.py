from django.apps import AppConfig


class HomeConfig(AppConfig):
    """The landing pages: the provider's fleet dashboard and a tenant's self-service view. They read through
    the selectors of the areas they show (fleet, jobs, tenancy) and own no models."""

    name = "home"
    verbose_name = "Home"
