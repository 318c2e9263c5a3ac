"""The one scoping function: every page, endpoint and consumer limits its queryset through ``restrict``."""

from django.db.models import QuerySet

from controlplane.access import principal


def restrict(queryset: QuerySet, user) -> QuerySet:
    """What of ``queryset`` the user may see.

    Provider roles see everything; tenant roles see the rows whose model's ``tenant_scope`` lookup equals
    their tenant; a model without ``tenant_scope`` is provider-only; anonymous users see nothing.
    """
    who = principal(user)
    if not who.is_authenticated:
        return queryset.none()
    if who.is_provider:
        return queryset
    lookup = getattr(queryset.model, "tenant_scope", None)
    if lookup is None or who.tenant_id is None:
        return queryset.none()
    return queryset.filter(**{lookup: who.tenant_id})
