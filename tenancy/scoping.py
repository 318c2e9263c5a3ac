"""The one scoping mechanism: what of a table a user may see. Every selector, page, endpoint and topic check
limits its rows through ``restrict`` (a queryset), ``scope_condition`` (the same condition as a ``Q``, for a
filter that is one branch of an OR), ``may_see`` (one row by key) or ``sees`` (a row already loaded).

Provider roles see everything; tenant roles see the rows whose ``scope`` lookup (by default the model's
``tenant_scope``) equals their tenant, and the rows ``also`` names; a model without ``tenant_scope`` is
provider-only; anonymous users, and users of no tenant that are not provider roles, see nothing. ``user``
may be a user or the Principal of one (a topic check has only the Principal).
"""

from django.db.models import Model, Q, QuerySet

from controlplane.access import Principal, principal

NOTHING = Q(pk__in=[])


def _who(user) -> Principal:
    return user if isinstance(user, Principal) else principal(user)


def scope_condition(
    model: type[Model], user, *, scope: str | Q | None = None, also: Q | None = None
) -> Q | None:
    """The condition ``restrict`` puts on ``model``'s rows for the user: None for provider roles (no
    condition), ``NOTHING`` for those who see no row."""
    who = _who(user)
    if not who.is_authenticated:
        return NOTHING
    if who.is_provider:
        return None
    scope = scope if scope is not None else getattr(model, "tenant_scope", None)
    if isinstance(scope, str):
        scope = Q(**{scope: who.tenant_id})
    seen = [condition for condition in (scope, also) if condition is not None]
    if who.tenant_id is None or not seen:
        return NOTHING
    return seen[0] if len(seen) == 1 else seen[0] | seen[1]


def restrict(
    queryset: QuerySet, user, *, scope: str | Q | None = None, also: Q | None = None, distinct: bool = False
) -> QuerySet:
    """What of ``queryset`` the user may see (the module's rule). ``scope`` replaces the model's lookup where
    a tenant sees the rows by another relation (the recovery actions of its own jobs), or is the condition
    itself (a Q of the rows it sees); ``also`` adds the rows a tenant sees besides its own (the faults that
    hit its jobs); ``distinct`` is for a ``scope`` through a to-many relation, which would repeat a row once
    per match."""
    condition = scope_condition(queryset.model, user, scope=scope, also=also)
    if condition is None:
        return queryset
    if condition is NOTHING:
        return queryset.none()
    rows = queryset.filter(condition)
    return rows.distinct() if distinct else rows


def may_see(user, model: type[Model], pk) -> bool:
    """Whether the user may see the row ``pk`` of ``model``: provider roles any key (whether or not it
    exists yet, as a topic of a job to come); others a row that exists and is in their scope."""
    who = _who(user)
    return who.is_provider or restrict(model.objects.filter(pk=pk), who).exists()


def sees(user, row: Model) -> bool:
    """``restrict`` for one row already loaded: its ``tenant_scope`` is followed through the row's
    attributes (each relation loaded as the attribute would load it)."""
    who = _who(user)
    if who.is_provider:
        return True
    scope = getattr(type(row), "tenant_scope", None)
    if scope is None or who.tenant_id is None:
        return False
    value = row
    for part in scope.split("__"):
        value = getattr(value, part, None) if value is not None else None
    return value == who.tenant_id
