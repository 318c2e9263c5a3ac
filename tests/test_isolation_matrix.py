"""The isolation matrix: every page, API endpoint and websocket topic, as each role of two tenants and the
provider, answers exactly what DESIGN's permission table says, and no answer carries what the role may not see.

Generated from the root URLconf and the topic registry (declarations in tests/support/matrix.py): a
pattern, an HTTP method of a viewset or a topic family that is not declared there fails its test, so a new
endpoint cannot escape. Each pattern with an object id is walked with the ids of both tenants' objects and
the provider's. Every request runs in a transaction that is rolled back, so writes (sent with an empty body)
leave the world as it was; the world itself is committed once for the module (websocket consumers read it
from their own threads) and flushed afterwards.
"""

import copy
import json
import re

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.core.management import call_command
from django.db import transaction
from django.test import Client
from django.urls import Resolver404, resolve, reverse

from controlplane import events
from controlplane.asgi import application
from tests.support.matrix import (
    ADMIN_VALUES,
    LOGIN,
    ROUTES,
    TOPICS,
    WALK_ROLES,
    Pattern,
    Who,
    admin_site,
    matrix_world_build,
    url_patterns,
)

PATTERNS = url_patterns()
WALKED = {"requests": 0}

# Each test runs in a transaction of its own (rolled back), over the world the module committed.
pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        try:
            built = matrix_world_build()
        except BaseException:
            call_command("flush", interactive=False, verbosity=0)
            raise
    yield built
    with django_db_blocker.unblock():
        call_command("flush", interactive=False, verbosity=0)


@pytest.fixture(scope="module")
def clients(world, django_db_blocker):
    """A client per role: pages signed in with a session, the API with the role's bearer token."""
    made = {}
    with django_db_blocker.unblock():
        for role in WALK_ROLES:
            page = Client(raise_request_exception=False)
            if role != "anonymous":
                page.force_login(world.users[role])
            headers = {"HTTP_AUTHORIZATION": f"Bearer {world.tokens[role]}"} if role != "anonymous" else {}
            made[role] = (page, Client(raise_request_exception=False), headers)
    return made


# --- filling patterns ---------------------------------------------------------------------------------------------


def fill(pattern: Pattern, values: dict[str, str]) -> str:
    """The URL of a pattern with its parameters filled; it must resolve back to the same pattern."""

    def converter(match):
        converter_name, name = match[1] or "", match[2]
        value = values[name]
        return f".{value}" if converter_name.startswith("drf_format_suffix") else value

    url = re.sub(r"\(\?P<(\w+)>(?:[^()]|\([^()]*\))*\)", lambda match: values[match[1]], pattern.route)
    url = re.sub(r"<(?:(\w+):)?(\w+)>", converter, url)
    url = "/" + url.replace("^", "").replace("$", "").replace("\\.", ".").replace("/?", "/")
    try:
        route = resolve(url).route
    except Resolver404:
        route = None
    assert route is not None and route.replace("^", "") == pattern.route.replace("^", ""), (
        f"{url} does not reach {pattern.route}"
    )
    return url


def requests_for(pattern: Pattern, world) -> list[tuple[str | None, str]]:
    """(owner of the object in the URL, URL) for each object the pattern is walked with."""
    params = set(pattern.params)
    if pattern.is_admin:
        return [(None, fill(pattern, ADMIN_VALUES))]
    route = ROUTES[pattern.key]
    values = {"format": "json", **route.values}
    ids = params & {"pk", "cluster_id"}
    if not ids:
        missing = params - values.keys()
        assert not missing, f"{pattern.key}: declare values for {sorted(missing)} in ROUTES"
        return [(None, fill(pattern, values))]
    assert route.fill, f"{pattern.key}: declare which kind of object fills {sorted(ids)} in ROUTES"
    rows = world.objects[route.fill]
    assert {owner for owner, _ in rows} >= (
        {"acme", "nimbus"} if route.fill not in PROVIDER_KINDS else {"provider"}
    )
    return [(owner, fill(pattern, {**values, **{name: str(pk) for name in ids}})) for owner, pk in rows]


# Kinds the world has only for the provider (no tenant owns a blueprint, a rollout, a what-if run…).
PROVIDER_KINDS = {
    "blueprint",
    "rollout",
    "agent-token",
    "launcher-credential",
    "notification-channel",
    "notification-delivery",
    "whatif",
    "scenario",
    "audit",
}


def viewset_methods(pattern: Pattern) -> set[str] | None:
    """The HTTP methods a DRF view answers (None for a plain Django view, which cannot say)."""
    cls = getattr(pattern.callback, "cls", None)
    if cls is None:
        return None
    actions = getattr(pattern.callback, "actions", None)
    served = set(actions) if actions else {method for method in cls.http_method_names if hasattr(cls, method)}
    return {method.upper() for method in served & set(cls.http_method_names)} - {"HEAD", "OPTIONS"}


# --- the walk -----------------------------------------------------------------------------------------------------


def send(client, method: str, url: str, headers: dict, api: bool):
    """One request inside a transaction that is rolled back."""
    with transaction.atomic():
        if method == "GET":
            response = client.get(url, **headers)
        elif api:
            response = getattr(client, method.lower())(
                url, data="{}", content_type="application/json", **headers
            )
        else:
            response = client.post(url, {}, **headers)
        transaction.set_rollback(True)
    WALKED["requests"] += 1
    return response


# JSON keys that hold the id of an object of a kind (``"job": 17``, ``"to_node": 5``…).
ID_KEYS = {
    "job": "job",
    "job_id": "job",
    "tenant": "tenant",
    "tenant_id": "tenant",
    "dedicated_tenant": "tenant",
    "cluster": "cluster",
    "cluster_id": "cluster",
    "node": "node",
    "node_id": "node",
    "to_node": "node",
    "from_node": "node",
    "fault": "fault",
    "fault_id": "fault",
    "action": "action",
    "action_id": "action",
    "incident": "incident",
    "incident_id": "incident",
}


def foreign_ids(world, who: Who, data, found: list[str]) -> list[str]:
    """Ids of the other tenant's objects anywhere in a JSON answer, under a key that names their kind."""
    if isinstance(data, dict):
        for key, value in data.items():
            kind = ID_KEYS.get(key)
            if kind and isinstance(value, int) and not isinstance(value, bool):
                for owner, owned in world.owned.items():
                    if owner != who.tenant and value in owned[kind]:
                        found.append(f"{key}={value} ({owner}'s)")
            foreign_ids(world, who, value, found)
    elif isinstance(data, list):
        for value in data:
            foreign_ids(world, who, value, found)
    return found


def leaks(world, who: Who, body: str, content_type: str = "") -> list[str]:
    """What of the other tenant's (or the provider's) the body names: its names and URLs, and in JSON the ids
    of its objects."""
    if who.provider:
        return []
    foreign = [owner for owner in world.markers if owner != who.tenant]
    found = [marker for owner in foreign for marker in world.markers[owner] if marker in body]
    if content_type.startswith("application/json") and body:
        found += foreign_ids(world, who, json.loads(body), [])
    return found


def walk(pattern: Pattern, world, clients) -> list[str]:
    problems = []
    if pattern.is_admin:
        methods = {"GET": admin_site}
    else:
        methods = ROUTES[pattern.key].methods
    api = pattern.is_api or pattern.key in ("metrics",)
    for owner, url in requests_for(pattern, world):
        for method, policy in methods.items():
            for role in WALK_ROLES:
                who = Who(role)
                page, api_client, headers = clients[role]
                client, extra = (api_client, headers) if api else (page, {})
                cookies = copy.deepcopy(client.cookies)
                response = send(client, method, url, extra, api)
                client.cookies = cookies  # a logout (or a new session) must not sign the role out of the walk
                expected = policy(who, owner, method)
                allowed = expected if isinstance(expected, frozenset) else {expected}
                where = f"{method} {url} as {role} ({owner or 'no object'})"
                if response.status_code not in allowed:
                    problems.append(
                        f"{where}: {response.status_code}, expected {sorted(allowed)}: "
                        f"{response.content[:160]!r}"
                    )
                    continue
                if (
                    response.status_code == LOGIN
                    and who.anonymous
                    and not pattern.is_admin
                    and method == "GET"
                ):
                    if not response["Location"].startswith(reverse(settings.LOGIN_URL)):
                        problems.append(f"{where}: redirected to {response['Location']}, not the login page")
                if response.status_code == LOGIN and pattern.is_admin:
                    logins = (reverse("admin:login"), reverse("admin:index"), reverse(settings.LOGIN_URL))
                    if not response["Location"].startswith(logins):
                        problems.append(f"{where}: redirected to {response['Location']}, not a login page")
                if response.status_code < 300 and not getattr(response, "streaming", False):
                    found = leaks(
                        world,
                        who,
                        response.content.decode("utf-8", "replace"),
                        response.get("Content-Type", ""),
                    )
                    if found:
                        problems.append(f"{where}: the answer names {found[:5]}")
    return problems


@pytest.mark.parametrize("pattern", PATTERNS, ids=[p.route for p in PATTERNS])
def test_pattern_answers_each_role_as_the_table_says(pattern, world, clients):
    if not pattern.is_admin:
        assert pattern.key in ROUTES, (
            f"{pattern.key} ({pattern.route}) is not in tests/support/matrix.py "
            f"ROUTES: declare how to fill it and what each role gets"
        )
        declared, served = set(ROUTES[pattern.key].methods), viewset_methods(pattern)
        if served is not None:
            assert declared == served, (
                f"{pattern.key} serves {sorted(served)}; ROUTES declares {sorted(declared)}"
            )
    problems = walk(pattern, world, clients)
    assert not problems, "\n".join(problems)


def test_every_declared_route_exists():
    assert set(ROUTES) <= {p.key for p in PATTERNS}, set(ROUTES) - {p.key for p in PATTERNS}


# --- what each list holds ----------------------------------------------------------------------------------------


def visible(world, who: Who, name: str) -> set[int]:
    """What DESIGN's table lets a role read of each scoped list, computed from the rows, not the selectors."""
    from django.contrib.auth import get_user_model
    from django.db.models import Q

    from fleet.models import Cluster, DriftFinding, Fleet, Node
    from jobs.models import FaultEvent, Incident, Job, RecoveryAction
    from tenancy.models import ApiToken

    tenant = world.tenant_ids.get(who.tenant)
    user = world.users[who.name]
    everything = who.provider
    if name == "api:job-list":
        rows = Job.objects.all() if everything else Job.objects.filter(tenant_id=tenant)
    elif name == "api:action-list":
        rows = (
            RecoveryAction.objects.all()
            if everything
            else RecoveryAction.objects.filter(job__tenant_id=tenant)
        )
    elif name == "api:fault-list":
        rows = (
            FaultEvent.objects.all()
            if everything
            else FaultEvent.objects.filter(
                Q(cluster__dedicated_tenant_id=tenant)
                | Q(actions__job__tenant_id=tenant)
                | Q(incident__actions__job__tenant_id=tenant)
            ).distinct()
        )
    elif name == "api:incident-list":
        rows = (
            Incident.objects.all()
            if everything
            else Incident.objects.filter(
                Q(cluster__dedicated_tenant_id=tenant) | Q(actions__job__tenant_id=tenant)
            ).distinct()
        )
    elif name == "api:cluster-list":
        rows = (
            Cluster.objects.all()
            if everything
            else Cluster.objects.filter(Q(dedicated_tenant_id=tenant) | Q(dedicated_tenant__isnull=True))
        )
    elif name == "api:node-list":
        rows = Node.objects.all() if everything else Node.objects.filter(cluster__dedicated_tenant_id=tenant)
    elif name == "api:drift-list":
        rows = (
            DriftFinding.objects.all()
            if everything
            else DriftFinding.objects.filter(cluster__dedicated_tenant_id=tenant)
        )
    elif name == "api:fleet-list":
        rows = (
            Fleet.objects.all()
            if everything
            else Fleet.objects.filter(clusters__dedicated_tenant_id=tenant).distinct()
        )
    elif name == "api:token-list":
        if who.kind == "provider-admin":
            rows = ApiToken.objects.all()
        elif who.kind == "tenant-admin":
            rows = ApiToken.objects.filter(user__membership__tenant_id=tenant)
        else:
            rows = ApiToken.objects.filter(user=user)
    elif name == "api:user-list":
        users = get_user_model().objects
        if who.kind == "provider-admin":
            rows = users.all()
        elif who.kind == "tenant-admin":
            rows = users.filter(membership__tenant_id=tenant)
        else:
            rows = users.filter(pk=user.pk)
    else:
        raise AssertionError(name)
    return set(rows.values_list("pk", flat=True))


OUTLINE = {"id", "name", "tier", "shared", "blueprint_version"}
SCOPED_LISTS = [
    "api:job-list",
    "api:action-list",
    "api:fault-list",
    "api:incident-list",
    "api:cluster-list",
    "api:node-list",
    "api:drift-list",
    "api:fleet-list",
    "api:token-list",
    "api:user-list",
]


@pytest.mark.parametrize("role", [r for r in WALK_ROLES if r != "anonymous"])
def test_each_list_holds_exactly_what_the_role_may_see(role, world, clients):
    from fleet.models import Cluster

    who = Who(role)
    _, client, headers = clients[role]
    problems = []
    for name in SCOPED_LISTS:
        response = send(client, "GET", reverse(name) + "?page_size=1000", headers, api=True)
        assert response.status_code == 200, (name, response.content[:200])
        rows = response.json()["results"]
        got = {row["id"] for row in rows}
        expected = visible(world, who, name)
        if name == "api:cluster-list" and not who.provider:
            # Of a shared cluster a tenant sees its name, tier and blueprint version, nothing more (DESIGN).
            shared = set(Cluster.objects.filter(dedicated_tenant__isnull=True).values_list("pk", flat=True))
            outlines = [row for row in rows if row["id"] in shared]
            assert outlines and all(set(row) == OUTLINE for row in outlines), outlines
        assert expected, f"the world has nothing {role} may see in {name}: the check would prove nothing"
        if got != expected:
            problems.append(
                f"{name} as {role}: extra {sorted(got - expected)}, missing {sorted(expected - got)}"
            )
    assert not problems, "\n".join(problems)


# --- websocket topics and the event log ---------------------------------------------------------------------------


def test_every_topic_family_is_declared():
    assert set(events.registered_topics()) == set(TOPICS), (
        "declare each topic family of the registry in tests/support/matrix.py TOPICS"
    )


def topic_names(world) -> list[tuple[str, str | None]]:
    """(topic, owner) for each family: keyed families with the ids of both tenants' objects and the provider's."""
    names = []
    for prefix, (kind, _) in sorted(TOPICS.items()):
        if kind is None:
            names.append((prefix, None))
        else:
            names += [(f"{prefix}-{pk}", owner) for owner, pk in world.objects[kind]]
    return names


async def connect(token: str | None):
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    communicator = WebsocketCommunicator(application, "/ws/events/", headers=headers)
    connected, code = await communicator.connect(timeout=5)
    return communicator, connected, code


@pytest.mark.parametrize("role", WALK_ROLES)
async def test_each_role_joins_exactly_the_topics_it_may_see(role, world, capsys):
    who = Who(role)
    names = topic_names(world)
    communicator, connected, code = await connect(world.tokens.get(role))
    if who.anonymous:
        assert not connected and code == 4401
        return
    assert connected
    assert (await communicator.receive_json_from(timeout=5))["type"] == "hello"
    await communicator.send_json_to({"subscribe": [name for name, _ in names]})
    reply = await communicator.receive_json_from(timeout=10)
    await communicator.disconnect()
    expected = {name for name, owner in names if TOPICS[name.split("-")[0]][1](who, owner)}
    assert set(reply["topics"]) == expected, reply
    assert set(reply["refused"]) == {name for name, _ in names} - expected, reply
    with capsys.disabled():
        print(f"\nwebsocket as {role}: {len(names)} topics of {len(TOPICS)} families, {len(expected)} joined")


@pytest.mark.parametrize("role", [r for r in WALK_ROLES if r != "anonymous"])
def test_event_log_answers_per_topic_as_the_websocket_does(role, world, clients):
    """Catch-up after a reconnect reads the same topics the websocket lets the role join, and no other."""
    who = Who(role)
    _, client, headers = clients[role]
    problems = []
    for name, owner in topic_names(world):
        response = send(client, "GET", f"{reverse('api:event-list')}?topic={name}", headers, api=True)
        expected = 200 if TOPICS[name.split("-")[0]][1](who, owner) else 403
        if response.status_code != expected:
            problems.append(f"{name} as {role}: {response.status_code}, expected {expected}")
        elif expected == 200 and not who.provider:
            found = leaks(world, who, response.content.decode(), response["Content-Type"])
            if found:
                problems.append(f"{name} as {role}: events name {found[:5]}")
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module", autouse=True)
def figures(request):
    """After the module: how much the matrix walked."""
    yield
    admin = sum(1 for p in PATTERNS if p.is_admin)
    with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print(
            f"\nisolation matrix: {len(PATTERNS)} URL patterns ({len(PATTERNS) - admin} Lockstep, {admin} admin) × "
            f"{len(WALK_ROLES)} roles, {WALKED['requests']} requests; {len(TOPICS)} topic families × "
            f"{len(WALK_ROLES)} roles over the websocket"
        )
