from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "tenancy"
    verbose_name = "Tenancy"

    def ready(self):
        from controlplane import access, events, navigation
        from tenancy import schema  # noqa: F401  (registers the bearer scheme with drf-spectacular)
        from tenancy.selectors import principal_for_user

        access.register_principal_resolver(principal_for_user)
        events.register_topic(
            "tenant", keyed=True, may_subscribe=lambda who, key: who.is_provider or who.in_tenant(key)
        )
        navigation.register("Users", "user-list", audience="users", order=78)
        navigation.register("API tokens", "token-list", audience="all", order=80)
