"""Permission and isolation matrices: who may reach which page, endpoint and topic (DESIGN's permission table).

Two matrices live here:

* ``API_LIST_MATRIX``: the status of a GET on every list endpoint for each role (tests/test_permission_matrix.py).
* ``ROUTES`` and ``TOPICS``: every URL pattern of the root URLconf and every topic family of the registry, with
  how to fill it (which object's id goes into ``{pk}``) and what each role of two tenants and the provider
  must get (tests/test_isolation_matrix.py). The test walks the URLconf and the registry themselves, so a
  pattern or a topic family that is not declared here fails it: no endpoint escapes its isolation test.

The world the isolation test walks (``matrix_world_build``) has two tenants, ``acme`` and ``nimbus``, each with
a dedicated cluster, jobs (on its own cluster and on a shared one), faults and their incidents, recovery actions,
drift, a snapshot, users and tokens; and the provider's objects (shared clusters, blueprints, a rollout, agent tokens, a
notification channel and delivery, predictions, a what-if run, a scenario, the audit trail).

The world builder imports the apps it uses when it runs, not at import time.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from django.urls import URLPattern, URLResolver, get_resolver

ROLES = ("anonymous", "provider-admin", "operator", "tenant-admin", "tenant-viewer")

# url name (in the "api" namespace) -> {role: expected status of GET}
API_LIST_MATRIX: dict[str, dict[str, int]] = {
    "tenant-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 403,
        "tenant-viewer": 403,
    },
    "token-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 200,
        "tenant-viewer": 200,
    },
    "user-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 200,
        "tenant-viewer": 200,
    },
    "agent-token-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 403,
        "tenant-viewer": 403,
    },
    "launcher-credential-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 403,
        "tenant-viewer": 403,
    },
    # Slurm jobs: tenants their own; those of unmapped accounts (no Lockstep job) providers only.
    "slurm-job-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 200,
        "tenant-viewer": 200,
    },
    "notification-channel-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 403,
        "tenant-viewer": 403,
    },
    "notification-delivery-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 403,
        "tenant-viewer": 403,
    },
    "whatif-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 403,
        "tenant-viewer": 403,
    },
    "prediction-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 403,
        "tenant-viewer": 403,
    },
    "audit-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 403,
        "tenant-viewer": 403,
    },
    # Jobs, incidents, faults and actions: everyone signed in, scoped to their tenant; stats default to the
    # tenant's figures.
    "job-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 200,
        "tenant-viewer": 200,
    },
    "incident-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 200,
        "tenant-viewer": 200,
    },
    "fault-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 200,
        "tenant-viewer": 200,
    },
    "action-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 200,
        "tenant-viewer": 200,
    },
    "stats-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 200,
        "tenant-viewer": 200,
    },
    # Fleet: tenants see their dedicated clusters (and shared ones in outline); blueprints and rollouts are provider-only.
    "fleet-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 200,
        "tenant-viewer": 200,
    },
    "cluster-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 200,
        "tenant-viewer": 200,
    },
    "node-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 200,
        "tenant-viewer": 200,
    },
    "blueprint-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 403,
        "tenant-viewer": 403,
    },
    "rollout-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 403,
        "tenant-viewer": 403,
    },
    "drift-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 200,
        "tenant-viewer": 200,
    },
    # Tenant users must name a topic they may see; without one the list is refused as a bad request.
    "event-list": {
        "anonymous": 401,
        "provider-admin": 200,
        "operator": 200,
        "tenant-admin": 400,
        "tenant-viewer": 400,
    },
}


def api_list_url_names() -> set[str]:
    """Names of the list routes registered under the ``api`` namespace."""
    return {p.name for p in url_patterns() if p.namespace == "api" and p.name and p.name.endswith("-list")}


# --- the URLconf, pattern by pattern ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Pattern:
    """One URL pattern of the root URLconf: its full route, name and namespace, and the view behind it."""

    route: str
    name: str | None
    namespace: str | None
    callback: Callable
    params: tuple[str, ...]

    @property
    def key(self) -> str:
        """What ``ROUTES`` is keyed by: ``api:job-detail``, ``fleet-cluster``, or the route for an unnamed one."""
        if self.name is None:
            return self.route
        return f"{self.namespace}:{self.name}" if self.namespace else self.name

    @property
    def is_admin(self) -> bool:
        return self.route.startswith("admin/")

    @property
    def is_api(self) -> bool:
        return self.route.startswith("api/v1/")


def url_patterns() -> list[Pattern]:
    """Every pattern of the root URLconf, included ones flattened."""
    found: list[Pattern] = []

    def walk(entries, prefix: str, namespace: str | None):
        for entry in entries:
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, prefix + str(entry.pattern), entry.namespace or namespace)
            elif isinstance(entry, URLPattern):
                found.append(
                    Pattern(
                        prefix + str(entry.pattern),
                        entry.name,
                        namespace,
                        entry.callback,
                        tuple(entry.pattern.regex.groupindex),
                    )
                )

    walk(get_resolver().url_patterns, "", None)
    return found


# --- who asks ---------------------------------------------------------------------------------------------------

TENANTS = ("acme", "nimbus")
WALK_ROLES = (
    "anonymous",
    "provider-admin",
    "operator",
    "acme-admin",
    "acme-viewer",
    "nimbus-admin",
    "nimbus-viewer",
)


@dataclass(frozen=True)
class Who:
    """A role of the walk: its kind (DESIGN's column) and, for tenant roles, its tenant."""

    name: str

    @property
    def kind(self) -> str:
        if self.name in ("anonymous", "provider-admin", "operator"):
            return self.name
        return "tenant-" + self.name.split("-", 1)[1]

    @property
    def tenant(self) -> str | None:
        return self.name.split("-", 1)[0] if self.kind.startswith("tenant-") else None

    @property
    def anonymous(self) -> bool:
        return self.kind == "anonymous"

    @property
    def provider(self) -> bool:
        return self.kind in ("provider-admin", "operator")

    @property
    def tenant_admin(self) -> bool:
        return self.kind == "tenant-admin"

    def relation(self, owner: str | None) -> str:
        """How the asker stands to an object: ``own`` (its tenant's), ``other`` (the other tenant's), or
        ``provider`` (an object of no tenant: shared clusters, blueprints…) ; ``none`` where no object is named."""
        if owner is None:
            return "none"
        if owner in TENANTS:
            return "own" if owner == self.tenant else "other"
        return "provider"


# --- what each role must get --------------------------------------------------------------------------------------
#
# A policy maps (who, the owner of the object in the URL, the HTTP method) to the status that must come back.
# Anonymous users get 401 from the API and a redirect to the login page from pages (``LOGIN``); a role that may
# not use a page or endpoint at all gets 403; an object a role may not see is 404, whatever it is, so an
# id of the other tenant's object tells nothing (a 404 is also what a missing object gets).

LOGIN = 302  # pages: anonymous users are sent to the login page
REDIRECT = 302  # a form page that did what it was asked sends the browser on
OK = 200
Expected = int | frozenset[int]
Policy = Callable[[Who, str | None, str], Expected]


def either(*codes: int) -> frozenset[int]:
    """An allowed write whose answer depends on the object's state (a snapshot of an unprotected job is 409)."""
    return frozenset(codes)


def _anonymous(who: Who, api: bool) -> int:
    return 401 if api else LOGIN


def signed_in(ok: Expected = OK, *, api: bool = True) -> Policy:
    """Everyone signed in; what they see is scoped (list contents are checked separately)."""
    return lambda who, owner, method: _anonymous(who, api) if who.anonymous else ok


def provider(ok: Expected = OK, *, api: bool = True, tenant: int = 403) -> Policy:
    """Provider roles only (DESIGN: blueprints, rollouts, cordon/drain, faults, snapshots, what-if, figures…)."""

    def policy(who, owner, method):
        if who.anonymous:
            return _anonymous(who, api)
        return ok if who.provider else tenant

    return policy


def provider_admin(ok: Expected = OK, *, api: bool = True) -> Policy:
    """The provider admin only (tenants, notification channels, cluster credentials)."""

    def policy(who, owner, method):
        if who.anonymous:
            return _anonymous(who, api)
        return ok if who.kind == "provider-admin" else 403

    return policy


def scoped(
    ok: Expected = OK, *, api: bool = True, shared: int = 404, tenant_writes: int | None = None
) -> Policy:
    """An object of a tenant (or of the provider): provider roles reach every one; a tenant's users reach
    their own tenant's (``ok``), get ``shared`` for a provider object (an outline of a shared cluster is 200)
    and 404 for the other tenant's. ``tenant_writes`` is what a tenant role gets for its own
    object when the operation is for provider roles only (403)."""

    def policy(who, owner, method):
        if who.anonymous:
            return _anonymous(who, api)
        if who.provider:
            return ok
        relation = who.relation(owner)
        if relation == "other":
            return 404
        if relation == "provider":
            return shared
        return tenant_writes if tenant_writes is not None else ok

    return policy


def tenant_writes(ok: Expected = OK, *, viewer: int = 403, api: bool = True) -> Policy:
    """Submit and cancel jobs: provider roles, and a tenant admin for its own tenant; a viewer reads only;
    the other tenant's object is 404."""

    def policy(who, owner, method):
        if who.anonymous:
            return _anonymous(who, api)
        if who.provider:
            return ok
        relation = who.relation(owner)
        if relation in ("other", "provider"):
            return 404
        return ok if who.tenant_admin else viewer

    return policy


def managed(ok: Expected = OK, *, self_only: int | None = 403, api: bool = True) -> Policy:
    """Users and tokens: the provider admin manages all; a tenant admin its tenant's; the operator and a
    tenant viewer only their own (the world's ``acme``/``nimbus`` token and user are the viewer's, the
    ``provider`` one is the operator's). ``self_only`` is what a user gets acting on their own row where only
    an admin may (deactivating a user). Anyone else's is 404."""

    def policy(who, owner, method):
        if who.anonymous:
            return _anonymous(who, api)
        if who.kind == "provider-admin":
            return ok
        mine = (who.kind == "operator" and owner == "provider") or (
            who.kind == "tenant-viewer" and owner == who.tenant
        )
        if mine:
            return ok if self_only is None else self_only
        if who.tenant_admin and owner == who.tenant:
            return ok
        return 404

    return policy


def user_admins(ok: Expected = OK, *, fill: bool = False) -> Policy:
    """The users page: the provider admin (every tenant's users) and a tenant admin (its own tenant's, another's
    user is 404); every other role is refused the page (403) before any user is looked up."""

    def policy(who, owner, method):
        if who.anonymous:
            return LOGIN
        if who.kind == "provider-admin":
            return ok
        if who.tenant_admin:
            return ok if not fill or owner == who.tenant else 404
        return 403

    return policy


def admin_site(who: Who, owner: str | None, method: str) -> int:
    """Django's admin is for staff; no role of DESIGN's table is staff: every page redirects to a login page
    (the admin's own login sends everyone on to Lockstep's)."""
    return LOGIN


def public(ok: Expected = OK) -> Policy:
    return lambda who, owner, method: ok


def per_method(**policies: Policy) -> dict[str, Policy]:
    return {method.upper(): policy for method, policy in policies.items()}


@dataclass(frozen=True)
class Route:
    """How to walk a pattern: the kind of object whose ids fill it (``fill``: every object of that kind the
    world has, of each owner), fixed values for its other parameters, and the policy per HTTP method."""

    methods: dict[str, Policy]
    fill: str | None = None
    values: dict[str, str] = field(default_factory=dict)


# Writes run in a transaction that is rolled back, so nothing the walk does stays. They send an empty body: a
# refused role is refused whatever it sends; an allowed one gets what an empty body deserves (a 400 for most)
# or the action done. Fleet, cluster and node writes are refused to tenant roles before any object is looked
# up (403 whichever cluster); job, fault and snapshot actions look the object up first (the other tenant's: 404).

ROUTES: dict[str, Route] = {
    # --- pages -------------------------------------------------------------------------------------------------
    "home": Route(per_method(get=signed_in(api=False), post=signed_in(api=False))),
    "audit-list": Route(per_method(get=provider(api=False))),
    "login": Route(per_method(get=public())),
    "logout": Route(per_method(post=public(REDIRECT))),
    "healthz": Route(per_method(get=public())),
    "readyz": Route(per_method(get=public())),
    "metrics": Route(per_method(get=provider())),
    "schema": Route(per_method(get=public())),
    "swagger-ui": Route(per_method(get=public())),
    "token-list": Route(per_method(get=signed_in(api=False), post=signed_in(api=False))),
    # Revoking asks first: an empty POST answers the confirmation page.
    "token-revoke": Route(per_method(post=managed(OK, self_only=None, api=False)), fill="token"),
    "user-list": Route(per_method(get=user_admins(), post=user_admins(400))),
    "user-remove": Route(per_method(post=user_admins(OK, fill=True)), fill="user"),
    # An empty body: the role form is bad input (400); the reset asks for a confirmation first (200).
    "user-role": Route(per_method(post=user_admins(400, fill=True)), fill="user"),
    "user-password-reset": Route(per_method(post=user_admins(OK, fill=True)), fill="user"),
    "whatif-list-page": Route(per_method(get=provider(api=False), post=provider(REDIRECT, api=False))),
    "whatif-detail": Route(per_method(get=provider(api=False)), fill="whatif"),
    "scenario-list": Route(
        per_method(get=provider(api=False), post=provider(either(REDIRECT, OK), api=False))
    ),
    "scenario-detail": Route(per_method(get=provider(api=False)), fill="scenario"),
    "prediction-list-page": Route(per_method(get=provider(api=False))),
    "fabric": Route(per_method(get=scoped(api=False)), fill="cluster"),
    "fleet-overview": Route(per_method(get=signed_in(api=False))),
    "fleet-clusters": Route(per_method(get=signed_in(api=False))),
    "fabric-index": Route(per_method(get=signed_in(api=False))),
    "fleet-cluster": Route(per_method(get=scoped(api=False)), fill="cluster"),
    "fleet-cluster-reconcile": Route(per_method(post=provider(REDIRECT, api=False)), fill="cluster"),
    "fleet-blueprints": Route(per_method(get=provider(api=False))),
    "fleet-blueprint": Route(per_method(get=provider(api=False)), fill="blueprint"),
    "fleet-rollouts": Route(per_method(get=provider(api=False))),
    "fleet-rollout": Route(per_method(get=provider(api=False)), fill="rollout"),
    "fleet-rollout-action": Route(
        per_method(post=provider(REDIRECT, api=False)), fill="rollout", values={"action": "pause"}
    ),
    "fleet-drift": Route(per_method(get=signed_in(api=False))),
    # The write actions' pages (issue 24): an empty POST is a 400 form, a redirect with the error, or (for the
    # actions that ask first) the confirmation page; tenant roles are refused before any object is looked up.
    "fleet-blueprint-import": Route(per_method(get=provider(api=False), post=provider(400, api=False))),
    "fleet-version-new": Route(
        per_method(get=provider(api=False), post=provider(400, api=False)), fill="blueprint"
    ),
    "fleet-version-activate": Route(
        per_method(post=provider(OK, api=False)), fill="blueprint", values={"number": "1"}
    ),
    "fleet-rollout-new": Route(per_method(get=provider(api=False), post=provider(400, api=False))),
    "fleet-cluster-assign": Route(per_method(post=provider(REDIRECT, api=False)), fill="cluster"),
    "fleet-node-action": Route(
        per_method(post=provider(OK, api=False)), fill="node", values={"action": "cordon"}
    ),
    "fleet-drift-sweep": Route(per_method(post=provider(REDIRECT, api=False))),
    "fleet-automation": Route(per_method(post=provider(REDIRECT, api=False))),
    "job-cancel": Route(per_method(post=tenant_writes(OK, api=False)), fill="job"),
    "job-list": Route(per_method(get=signed_in(api=False))),
    "job-detail": Route(per_method(get=scoped(api=False)), fill="job"),
    "fault-overview": Route(per_method(get=signed_in(api=False))),
    # A node of a cluster the reader does not see in full, and an incident it may not see, are 404s.
    "node-detail": Route(per_method(get=scoped(api=False)), fill="node"),
    "incident-detail": Route(per_method(get=scoped(api=False)), fill="incident"),
    # Incidents as on-call work: a step is the provider's (a tenant's own incident: 403), done or refused on the
    # page (a redirect with the message); another tenant's incident is a 404.
    "incident-list": Route(per_method(get=signed_in(api=False))),
    "incident-act": Route(
        per_method(post=scoped(REDIRECT, api=False, tenant_writes=403)),
        fill="incident",
        values={"action": "acknowledge"},
    ),
    "search": Route(per_method(get=signed_in(api=False)), values={}),
    # --- the API ---------------------------------------------------------------------------------------------
    "api:api-root": Route(per_method(get=signed_in())),
    # Tenant users must name a topic they may see (the event log is walked per topic by its own test).
    "api:event-list": Route(per_method(get=provider(tenant=400))),
    "api:audit-list": Route(per_method(get=provider())),
    "api:audit-detail": Route(per_method(get=provider()), fill="audit"),
    "api:tenant-list": Route(per_method(get=provider(), post=provider_admin(400))),
    "api:tenant-detail": Route(per_method(get=provider(), patch=provider_admin()), fill="tenant"),
    "api:token-list": Route(per_method(get=signed_in(), post=signed_in(400))),
    "api:token-detail": Route(
        per_method(get=managed(self_only=None), delete=managed(204, self_only=None)), fill="token"
    ),
    "api:user-list": Route(per_method(get=signed_in(), post=signed_in(400))),
    "api:user-detail": Route(per_method(get=managed(self_only=None), delete=managed(204)), fill="user"),
    "api:user-role": Route(per_method(post=managed(400)), fill="user"),
    "api:user-reset-password": Route(per_method(post=managed(OK)), fill="user"),
    "api:fleet-list": Route(per_method(get=signed_in(), post=provider(400))),
    "api:fleet-detail": Route(
        per_method(get=scoped(), patch=provider(), delete=provider(either(204, 409))), fill="fleet"
    ),
    "api:cluster-list": Route(per_method(get=signed_in(), post=provider(400))),
    "api:cluster-detail": Route(
        per_method(get=scoped(shared=OK), patch=provider(), delete=provider(either(204, 409))), fill="cluster"
    ),
    "api:cluster-blueprint": Route(per_method(put=provider(400)), fill="cluster"),
    "api:cluster-reconcile": Route(per_method(post=provider()), fill="cluster"),
    "api:node-list": Route(per_method(get=signed_in())),
    "api:node-detail": Route(per_method(get=scoped(), patch=provider(400)), fill="node"),
    "api:node-cordon": Route(per_method(post=provider(either(200, 409))), fill="node"),
    "api:node-drain": Route(per_method(post=provider(either(200, 409))), fill="node"),
    "api:node-uncordon": Route(per_method(post=provider(either(200, 409))), fill="node"),
    "api:blueprint-list": Route(per_method(get=provider(), post=provider(400))),
    "api:blueprint-detail": Route(per_method(get=provider(), patch=provider()), fill="blueprint"),
    "api:blueprint-versions": Route(per_method(get=provider(), post=provider(201)), fill="blueprint"),
    "api:blueprint-version": Route(
        per_method(get=provider(), patch=provider(either(200, 400))), fill="blueprint", values={"number": "1"}
    ),
    "api:blueprint-activate": Route(
        per_method(post=provider(either(200, 400, 409))), fill="blueprint", values={"number": "1"}
    ),
    "api:blueprint-disable": Route(
        per_method(post=provider(either(200, 400, 409))), fill="blueprint", values={"number": "1"}
    ),
    "api:blueprint-diff": Route(per_method(get=provider(400)), fill="blueprint"),
    "api:blueprint-yaml": Route(per_method(get=provider(), put=provider(415)), fill="blueprint"),
    # The matrix world's blueprint has no git source: reads and deletes find none; a PUT without a URL is refused.
    "api:blueprint-source": Route(
        per_method(get=provider(404), put=provider(400), delete=provider(404)), fill="blueprint"
    ),
    "api:blueprint-source-sync": Route(per_method(post=provider(404)), fill="blueprint"),
    "api:blueprint-overlays": Route(per_method(get=provider(), put=provider(400)), fill="blueprint"),
    # A git host's webhook: no token, only the signature over the body, which no request here carries.
    "api:blueprint-source-webhook": Route(
        per_method(post=lambda who, owner, method: 401), values={"source_id": "1"}
    ),
    "api:rollout-list": Route(per_method(get=provider(), post=provider(400))),
    "api:rollout-detail": Route(per_method(get=provider()), fill="rollout"),
    "api:rollout-cancel": Route(per_method(post=provider(either(200, 409))), fill="rollout"),
    "api:rollout-pause": Route(per_method(post=provider(either(200, 409))), fill="rollout"),
    "api:rollout-resume": Route(per_method(post=provider(either(200, 409))), fill="rollout"),
    "api:rollout-rollback": Route(per_method(post=provider(either(200, 409))), fill="rollout"),
    "api:drift-list": Route(per_method(get=signed_in())),
    "api:drift-detail": Route(per_method(get=scoped()), fill="drift"),
    "api:drift-sweep": Route(per_method(post=provider(202))),
    "api:drift-ignored": Route(per_method(get=signed_in())),
    # Agents' own endpoint: it takes an agent token, which no user has (tests/telemetry cover the agents).
    "api:ingest-telemetry": Route(per_method(post=lambda who, owner, method: 401)),
    "api:ingest-alertmanager": Route(per_method(post=provider(400))),
    "api:job-diagnosis": Route(per_method(get=scoped()), fill="job"),
    "api:agent-token-list": Route(per_method(get=provider(), post=provider(400))),
    "api:launcher-credential-list": Route(per_method(get=provider(), post=provider(400))),
    "api:launcher-credential-detail": Route(
        per_method(get=provider(), delete=provider(204)), fill="launcher-credential"
    ),
    # A launcher credential (lsl_…) only: every user's token and no token at all are unauthenticated here.
    "api:launcher-register": Route(per_method(post=lambda who, owner, method: 401)),
    "api:slurm-job-list": Route(per_method(get=signed_in())),
    "api:slurm-job-detail": Route(per_method(get=scoped()), fill="slurm-job"),
    "api:agent-token-detail": Route(per_method(get=provider(), delete=provider(204)), fill="agent-token"),
    "api:agent-token-rotate": Route(per_method(post=provider(201)), fill="agent-token"),
    "api:notification-channel-list": Route(per_method(get=provider(), post=provider_admin(400))),
    "api:notification-channel-detail": Route(
        per_method(get=provider(), patch=provider_admin(), delete=provider_admin(204)),
        fill="notification-channel",
    ),
    "api:notification-delivery-list": Route(per_method(get=provider())),
    "api:notification-delivery-detail": Route(per_method(get=provider()), fill="notification-delivery"),
    "api:prediction-list": Route(per_method(get=provider())),
    "api:prediction-detail": Route(per_method(get=provider()), fill="prediction"),
    "api:whatif-list": Route(per_method(get=provider(), post=provider(202))),
    "api:whatif-detail": Route(per_method(get=provider()), fill="whatif"),
    "api:job-list": Route(per_method(get=signed_in(), post=tenant_writes(400))),
    "api:job-detail": Route(per_method(get=scoped()), fill="job"),
    "api:job-cancel": Route(per_method(post=tenant_writes()), fill="job"),
    "api:job-progress": Route(per_method(post=tenant_writes(400)), fill="job"),
    "api:job-snapshots": Route(
        per_method(get=scoped(), post=scoped(either(201, 409), tenant_writes=403)), fill="job"
    ),
    "api:job-timeline": Route(per_method(get=scoped()), fill="job"),
    "api:incident-list": Route(per_method(get=signed_in())),
    "api:incident-detail": Route(per_method(get=scoped()), fill="incident"),
    # The on-call work: the provider's steps (an empty body: 400, or a state that refuses: 409); notes are also a
    # tenant admin's (its viewer's 403).
    "api:incident-work": Route(per_method(get=scoped()), fill="incident"),
    "api:incident-acknowledge": Route(
        per_method(post=scoped(either(200, 409), tenant_writes=403)), fill="incident"
    ),
    "api:incident-assign": Route(per_method(post=scoped(400, tenant_writes=403)), fill="incident"),
    "api:incident-notes": Route(per_method(get=scoped(), post=tenant_writes(400)), fill="incident"),
    "api:incident-resolve": Route(per_method(post=scoped(400, tenant_writes=403)), fill="incident"),
    "api:incident-reopen": Route(per_method(post=scoped(409, tenant_writes=403)), fill="incident"),
    "api:fault-list": Route(per_method(get=signed_in(), post=provider(400))),
    "api:fault-detail": Route(per_method(get=scoped()), fill="fault"),
    "api:fault-repaired": Route(per_method(post=scoped(either(200, 409), tenant_writes=403)), fill="fault"),
    "api:action-list": Route(per_method(get=signed_in())),
    "api:action-detail": Route(per_method(get=scoped()), fill="action"),
    "api:stats-list": Route(per_method(get=signed_in())),
    "api:automation": Route(per_method(get=provider(), put=provider(400))),
}

# Django's admin is walked with ``admin_site``, every pattern filled with these values.
ADMIN_VALUES = {
    "object_id": "1",
    "content_type_id": "1",
    "id": "1",
    "app_label": "fleet",
    "url": "nothing-here",
}

# --- websocket topics -------------------------------------------------------------------------------------------
#
# topic family -> (the kind of object whose ids key it, or None for an unkeyed topic; who may subscribe).
# DESIGN: provider roles follow every topic; the ``fleet`` topic and the topics of shared clusters and of
# rollouts are theirs alone; a tenant's users follow their tenant's topic, their jobs' and their dedicated
# clusters'.

TopicPolicy = Callable[[Who, str | None], bool]


def _provider_topic(who: Who, owner: str | None) -> bool:
    return who.provider


def _scoped_topic(who: Who, owner: str | None) -> bool:
    return who.provider or who.relation(owner) == "own"


TOPICS: dict[str, tuple[str | None, TopicPolicy]] = {
    "fleet": (None, _provider_topic),
    "rollout": ("rollout", _provider_topic),
    "cluster": ("cluster", _scoped_topic),
    "job": ("job", _scoped_topic),
    "tenant": ("tenant", _scoped_topic),
}


# --- the world walked -------------------------------------------------------------------------------------------


@dataclass
class MatrixWorld:
    """Users and API tokens per walk role; ``objects[kind]`` is a list of (owner, id), owner being a tenant
    slug or ``provider``; ``markers[tenant]`` are strings only that tenant (and the provider) may read."""

    users: dict
    tokens: dict[str, str]
    objects: dict[str, list[tuple[str, int]]]
    tenant_ids: dict[str, int]
    markers: dict[str, list[str]]
    # owned[tenant][kind]: ids of every object of that kind only that tenant (and the provider) may see.
    owned: dict[str, dict[str, set[int]]] = field(default_factory=dict)


def matrix_world_build() -> MatrixWorld:
    """Build the isolation matrix's world through Lockstep's services (a few rows the services only write
    from live telemetry, predictions and deliveries, are written directly)."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from controlplane.access import Role
    from controlplane.models import AuditEntry
    from fleet.drivers.simulated import simulate_drift
    from fleet.models import Blueprint, Cluster, DriftFinding, Fleet, Node, Rollout
    from fleet.services.drift import drift_sweep
    from jobs.launchers import launcher_credential_create
    from jobs.models import FaultEvent, Incident, Job, RecoveryAction
    from jobs.services.faults import fault_handle, fault_ingest
    from jobs.services.jobs import job_submit
    from jobs.services.snapshots import snapshot_take
    from simulator.models import Scenario
    from simulator.services.whatifs import whatif_execute, whatif_start
    from simulator.world import world_build
    from telemetry.models import AgentToken, NotificationDelivery, Prediction
    from telemetry.services.channels import channel_create
    from tenancy.models import ApiToken, Tenant
    from tenancy.services import token_create, user_create

    User = get_user_model()
    world_build(seed=11, nodes_per_cluster=8, spares=2)
    provider_admin = User.objects.get(username="lockstep-simulator")
    operator, _ = user_create(actor=provider_admin, username="fleet-operator", role=Role.OPERATOR)
    tenants = {slug: Tenant.objects.get(slug=slug) for slug in TENANTS}
    users = {"provider-admin": provider_admin, "operator": operator}
    for slug in TENANTS:
        for kind in ("admin", "viewer"):
            users[f"{slug}-{kind}"] = User.objects.get(username=f"{slug}-{kind}")
    tokens = {}
    token_rows = {}
    for role, user in users.items():
        row, raw = token_create(actor=user, owner=user, name=f"{role}-matrix-token", scope="write")
        tokens[role], token_rows[role] = raw, row

    dedicated = {slug: Cluster.objects.get(dedicated_tenant=tenants[slug]) for slug in TENANTS}
    shared = list(Cluster.objects.filter(dedicated_tenant__isnull=True).order_by("name"))
    # A job of each tenant on a shared cluster (the demo world puts acme's there already).
    job_submit(
        actor=provider_admin,
        tenant=tenants["nimbus"],
        cluster=shared[-1],
        name="nimbus-shared-run",
        gpus=16,
        seconds_per_iteration=2.0,
        checkpoint_interval=500,
        total_iterations=1_000_000,
    )

    protected_job = (
        Job.objects.filter(tenant=tenants["nimbus"], cluster=dedicated["nimbus"]).order_by("pk").first()
    )
    snapshot_take(actor=provider_admin, job=protected_job)

    def job_node(job):
        return job.allocations.filter(released_at__isnull=True).select_related("node").first().node

    faults = {}
    for slug in TENANTS:
        own_job = Job.objects.filter(tenant=tenants[slug], cluster=dedicated[slug]).order_by("pk").first()
        fault, _ = fault_ingest(
            source="api", kind="nic_down", node=job_node(own_job), nic_name="mlx5_0", actor=provider_admin
        )
        faults[slug] = fault
        shared_job = Job.objects.filter(tenant=tenants[slug], cluster__in=shared).order_by("pk").first()
        fault_ingest(
            source="api", kind="nic_down", node=job_node(shared_job), nic_name="mlx5_1", actor=provider_admin
        )
    busy = Job.objects.values("allocations__node")
    idle_shared = Node.objects.filter(cluster=shared[0]).exclude(pk__in=busy).order_by("hostname").first()
    provider_fault, _ = fault_ingest(source="api", kind="thermal", node=idle_shared, actor=provider_admin)
    for fault in FaultEvent.objects.order_by("pk"):
        fault_handle(fault_id=fault.pk)
    # Each failure is an incident of its reports and its recoveries (written here where intake has not linked them).
    for fault in FaultEvent.objects.filter(incident__isnull=True).order_by("pk"):
        incident = Incident.objects.create(
            cluster_id=fault.cluster_id,
            node_id=fault.node_id,
            kind=fault.kind,
            xid=fault.xid,
            nic_name=fault.nic_name,
            scope="nic" if fault.nic_name else "node",
            opened_at=fault.detected_at,
            last_reported_at=fault.last_reported_at,
            report_count=fault.report_count,
        )
        FaultEvent.objects.filter(pk=fault.pk).update(incident=incident)
    for fault_id, incident_id in FaultEvent.objects.values_list("pk", "incident_id"):
        RecoveryAction.objects.filter(fault_id=fault_id, incident__isnull=True).update(
            incident_id=incident_id
        )

    for cluster in [*dedicated.values(), shared[-1]]:
        simulate_drift(cluster, addon="dcgm-exporter", kind="values")
    drift_sweep(cluster_ids=[c.pk for c in Cluster.objects.all()])

    now = timezone.now()
    predictions = {}
    for owner, cluster in [*dedicated.items(), ("provider", shared[0])]:
        node = cluster.nodes.order_by("hostname").first()
        predictions[owner] = Prediction.objects.create(
            node=node,
            cluster=cluster,
            score=0.91,
            threshold=0.8,
            horizon_hours=6.0,
            predicted_at=now,
            cause=f"temperature rising on {node.hostname}",
            cause_kind="thermal",
            evidence={"trend": 3.2},
        )
    channel = channel_create(
        actor=provider_admin, name="matrix-pager", url="https://pager.example/hook", rules=["recovery_failed"]
    )
    delivery = NotificationDelivery.objects.create(
        channel=channel,
        event_id=1,
        rule="recovery_failed",
        summary="a recovery failed",
        next_attempt_at=now + timedelta(minutes=1),
    )
    run = whatif_start(actor=provider_admin, config={"seed": 5, "days": 1, "gpus": 1024})
    # Run here, to the end (no worker runs it): a queued one would count against the what-if caps of every POST,
    # and the report page is read (and checked by axe) with its report.
    whatif_execute(run_id=run.pk)
    acme_job = Job.objects.filter(tenant=tenants["acme"]).order_by("pk").first()
    scenario = Scenario.objects.create(
        kind="ab-nic",
        jobs={"protected": acme_job.pk, "unprotected": acme_job.pk},
        nic_name="mlx5_3",
        strike_at=now + timedelta(hours=1),
    )

    def owner_of_cluster(cluster_id):
        for slug, cluster in dedicated.items():
            if cluster.pk == cluster_id:
                return slug
        return "provider"

    from jobs.models import SlurmJob

    slurm_jobs = [
        (
            slug,
            SlurmJob.objects.create(
                job=job, cluster_id=job.cluster_id, slurm_job_id=f"{900 + job.pk}", account=slug
            ).pk,
        )
        for slug in TENANTS
        for job in [Job.objects.filter(tenant__slug=slug).order_by("pk").first()]
    ]
    slurm_jobs.append(
        (
            "provider",
            SlurmJob.objects.create(
                cluster=shared[0],
                slurm_job_id="999",
                account="nobody",
                unmapped="account 'nobody' maps to no tenant",
            ).pk,
        )
    )
    objects: dict[str, list[tuple[str, int]]] = {
        "tenant": [(slug, tenants[slug].pk) for slug in TENANTS],
        "slurm-job": slurm_jobs,
        # The tenant's token and user are its viewer's; the provider's are the operator's (see ``managed``).
        "token": [(slug, token_rows[f"{slug}-viewer"].pk) for slug in TENANTS]
        + [("provider", token_rows["operator"].pk)],
        "user": [(slug, users[f"{slug}-viewer"].pk) for slug in TENANTS] + [("provider", operator.pk)],
        "fleet": [(slug, dedicated[slug].fleet_id) for slug in TENANTS],
        "cluster": [(slug, dedicated[slug].pk) for slug in TENANTS] + [("provider", shared[0].pk)],
        "node": [(slug, dedicated[slug].nodes.order_by("hostname").first().pk) for slug in TENANTS]
        + [("provider", shared[0].nodes.order_by("hostname").first().pk)],
        "blueprint": [("provider", Blueprint.objects.order_by("pk").first().pk)],
        "rollout": [("provider", Rollout.objects.order_by("pk").first().pk)],
        "drift": [
            (owner_of_cluster(cluster_id), pk)
            for pk, cluster_id in DriftFinding.objects.filter(resolved_at__isnull=True).values_list(
                "pk", "cluster_id"
            )
        ],
        "agent-token": [("provider", AgentToken.objects.order_by("pk").first().pk)],
        "launcher-credential": [
            (
                "provider",
                launcher_credential_create(
                    actor=provider_admin, cluster=Cluster.objects.order_by("pk").first(), name="matrix"
                )[0].pk,
            )
        ],
        "notification-channel": [("provider", channel.pk)],
        "notification-delivery": [("provider", delivery.pk)],
        "prediction": [(owner, row.pk) for owner, row in predictions.items()],
        "whatif": [("provider", run.pk)],
        "scenario": [("provider", scenario.pk)],
        "audit": [("provider", AuditEntry.objects.order_by("pk").first().pk)],
        # Jobs on the tenant's own cluster and on a shared one.
        "job": [(job.tenant.slug, job.pk) for job in Job.objects.select_related("tenant").order_by("pk")],
        "fault": [(slug, faults[slug].pk) for slug in TENANTS] + [("provider", provider_fault.pk)],
        "incident": [(slug, FaultEvent.objects.get(pk=faults[slug].pk).incident_id) for slug in TENANTS]
        + [("provider", FaultEvent.objects.get(pk=provider_fault.pk).incident_id)],
        "action": [
            (action.job.tenant.slug, action.pk)
            for action in RecoveryAction.objects.filter(job__isnull=False)
            .select_related("job__tenant")
            .order_by("pk")
        ],
    }
    owned = {}
    for slug, tenant in tenants.items():
        cluster = dedicated[slug]
        owned[slug] = {
            "tenant": {tenant.pk},
            "cluster": {cluster.pk},
            "node": set(cluster.nodes.values_list("pk", flat=True)),
            "job": set(Job.objects.filter(tenant=tenant).values_list("pk", flat=True)),
            "action": set(RecoveryAction.objects.filter(job__tenant=tenant).values_list("pk", flat=True)),
            "fault": set(FaultEvent.objects.filter(cluster=cluster).values_list("pk", flat=True))
            | set(
                RecoveryAction.objects.filter(job__tenant=tenant, fault__isnull=False).values_list(
                    "fault_id", flat=True
                )
            ),
            "incident": set(Incident.objects.filter(cluster=cluster).values_list("pk", flat=True))
            | set(
                RecoveryAction.objects.filter(job__tenant=tenant, incident__isnull=False).values_list(
                    "incident_id", flat=True
                )
            ),
        }
    markers = {}
    for slug, tenant in tenants.items():
        jobs = Job.objects.filter(tenant=tenant)
        found = [
            tenant.name,
            f"{slug}-",
            dedicated[slug].name,
            f'tenant-{tenant.pk}"',
            f'cluster-{dedicated[slug].pk}"',
        ]
        found += [
            name
            for name in ApiToken.objects.filter(user__membership__tenant=tenant).values_list(
                "name", flat=True
            )
        ]
        found += [f"/jobs/{pk}/" for pk in jobs.values_list("pk", flat=True)]
        found += [f'job-{pk}"' for pk in jobs.values_list("pk", flat=True)]
        found += [
            f"/actions/{pk}/"
            for pk in RecoveryAction.objects.filter(job__tenant=tenant).values_list("pk", flat=True)
        ]
        found += [f"/incidents/{pk}/" for pk in owned[slug]["incident"]]
        markers[slug] = found
    # What no tenant may read: a shared host none of its jobs runs on, the provider's users, tokens and channels.
    markers["provider"] = [
        idle_shared.hostname,
        "matrix-pager",
        "fleet-operator",
        "provider-admin-matrix-token",
        "operator-matrix-token",
    ]
    assert Fleet.objects.count() == 2 and len(objects["drift"]) >= 3 and len(objects["action"]) >= 2, objects
    return MatrixWorld(
        users=users,
        tokens=tokens,
        objects=objects,
        tenant_ids={slug: t.pk for slug, t in tenants.items()},
        markers=markers,
        owned=owned,
    )
