"""Issue 54's lows, each as the attack did it and seen refused: a YAML document that held a web thread for seconds,
X-Forwarded-For believed from a uvicorn started by hand, refused logins and progress reports that left no audit
entry, a user opening websockets without end, and the Django admin's user form writing users past the services.
(The job-submit answers are in tests/jobs/test_submit_answers.py, the Kubernetes driver's errors in
tests/fleet/test_kubernetes_unreachable.py.)"""

import asyncio
import re
import time

import pytest
import requests
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client, RequestFactory

from controlplane import consumers
from controlplane.asgi import application
from controlplane.models import AuditEntry
from controlplane.security_ratelimit import client_address
from fleet.models import Blueprint
from jobs.services.jobs import job_submit
from tenancy import services
from tenancy.choices import Role
from tests.support.factories import make_blueprint, make_cluster, make_node, make_user
from tests.support.processes import uvicorn_server

pytestmark = pytest.mark.django_db
PASSWORD = "correct-horse-9"


# --- a YAML document that holds a web thread ---------------------------------------------------------------------


@pytest.fixture
def blueprint_url(api, users):
    blueprint, _ = make_blueprint("lows-bp")
    api.as_token(users["operator"], "write")
    return blueprint, f"/api/v1/blueprints/{blueprint.pk}/yaml/"


def put_yaml(api, url, document: str):
    started = time.process_time()
    response = api.generic("PUT", url, document, content_type="application/yaml")
    return response, time.process_time() - started


def test_the_attacks_389_kb_document_is_refused_unread(api, blueprint_url):
    blueprint, url = blueprint_url
    attack = "[" + ",".join(["1"] * (389 * 1024 // 2 - 1)) + "]"  # 389 KB: 11.5 s of a web thread before
    response, cpu = put_yaml(api, url, attack)
    assert response.status_code == 400, response.content[:300]
    assert response.json() == {"document": ["the document is over 262144 bytes"]}
    assert cpu < 1, f"{cpu:.2f} s of CPU to refuse it"
    assert blueprint.versions.count() == 1


@pytest.mark.parametrize(
    "document, answer",
    [
        ("[" + ",".join(["1"] * 100_000) + "]", "the document holds more than 20000 YAML nodes"),
        ("".join(f"k{i}: v\n" for i in range(20_000)), "the document holds more than 20000 YAML nodes"),
        ("".join("  " * i + f"k{i}:\n" for i in range(70)), "the document nests deeper than 64 levels"),
        ("a: &x [1, 2]\nb: *x\n", "not valid YAML: anchors and aliases are not allowed (line 1)"),
    ],
)
def test_documents_under_the_byte_cap_are_refused_at_their_first_node_past_a_bound(
    api, blueprint_url, document, answer
):
    blueprint, url = blueprint_url
    assert len(document) < 256 * 1024
    response, cpu = put_yaml(api, url, document)
    assert response.status_code == 400 and response.json()["document"][0].startswith(answer), response.content
    # Before the bounds a document of these sizes took seconds (bench/yaml_parse.py); the scan stops early.
    assert cpu < 1.5, f"{cpu:.2f} s of CPU to refuse it"
    assert blueprint.versions.count() == 1


def test_the_caps_are_settings_and_a_document_within_them_is_read(api, blueprint_url, settings):
    blueprint, url = blueprint_url
    document = api.get(url, HTTP_ACCEPT="application/yaml").content.decode()
    assert put_yaml(api, url, document)[0].status_code == 200
    settings.BLUEPRINT_YAML_MAX_NODES = 10
    response, _ = put_yaml(api, url, document)
    assert response.json() == {"document": ["the document holds more than 10 YAML nodes"]}
    settings.BLUEPRINT_YAML_MAX_NODES, settings.BLUEPRINT_YAML_MAX_BYTES = 20_000, 100
    assert put_yaml(api, url, document)[0].json() == {"document": ["the document is over 100 bytes"]}


def test_the_version_page_reads_its_content_within_the_same_bounds(client, users):
    blueprint, _ = make_blueprint("lows-page-bp")
    client.force_login(users["operator"])
    bomb = "addons: [" + ",".join(["{}"] * 30_000) + "]\n"
    page = client.post(f"/blueprints/{blueprint.pk}/versions/new/", {"content": bomb, "parent": ""})
    assert page.status_code == 400 and "more than 20000 YAML nodes" in page.content.decode()
    assert blueprint.versions.count() == 1 and Blueprint.objects.count() == 1


# --- X-Forwarded-For from a uvicorn started by hand ---------------------------------------------------------------


def request_from(remote: str, forwarded: str | None = None):
    extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {}
    return RequestFactory().post("/accounts/login/", REMOTE_ADDR=remote, **extra)


def test_an_address_taken_from_the_header_is_believed_only_with_proxies_configured(settings):
    settings.FORWARDED_ALLOW_IPS = []
    assert client_address(request_from("203.0.113.7")) == "203.0.113.7"
    # uvicorn trusted the peer (127.0.0.1, its default) and took the header's word: not vouched for.
    assert client_address(request_from("198.51.100.1", "198.51.100.1")) is None
    assert client_address(request_from("198.51.100.1", "10.0.0.1, 198.51.100.1:4711")) is None
    assert client_address(request_from("2001:db8::1", "[2001:db8::1]:80")) is None
    # A peer whose own address is not in the header was not rewritten: it is the peer.
    assert client_address(request_from("203.0.113.7", "198.51.100.1")) == "203.0.113.7"
    settings.FORWARDED_ALLOW_IPS = ["10.0.0.5"]  # behind a configured proxy uvicorn chose it as told
    assert client_address(request_from("198.51.100.1", "198.51.100.1")) == "198.51.100.1"


def login_attempts(server, addresses: list[str], prefix: str) -> list[int]:
    statuses = []
    for n, address in enumerate(addresses):
        session = requests.Session()
        session.get(f"{server.url}/accounts/login/", timeout=10)
        answer = session.post(
            f"{server.url}/accounts/login/",
            timeout=10,
            allow_redirects=False,
            data={
                "username": f"{prefix}-{n}",
                "password": "wrong",
                "csrfmiddlewaretoken": session.cookies.get("csrftoken"),
            },
            headers={"X-Forwarded-For": address, "Referer": f"{server.url}/accounts/login/"},
        )
        statuses.append(answer.status_code)
    return statuses


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_uvicorn_started_by_hand_does_not_let_a_client_rotate_its_address(tmp_path, monkeypatch):
    """The attack: ``uvicorn controlplane.asgi:application`` with neither the Procfile's flag nor the variable, so
    uvicorn believes X-Forwarded-For from 127.0.0.1; a client on the host sends a new address with every login."""
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    with uvicorn_server(tmp_path, LOGIN_ADDRESS_RATE="3/hour", LOGIN_RATE="100/hour") as server:
        statuses = login_attempts(server, [f"203.0.113.{n}" for n in range(5)], "by-hand")
    assert statuses == [200, 200, 200, 429, 429], statuses


# --- refused logins and progress reports are audited ---------------------------------------------------------------


def test_a_wrong_password_leaves_an_audit_entry_naming_the_user_and_the_address(client, users, tenant_a):
    viewer = users["tenant-viewer"]
    client.post(
        "/accounts/login/", {"username": viewer.username, "password": "wrong"}, REMOTE_ADDR="10.9.8.7"
    )
    client.post("/accounts/login/", {"username": "nobody\x00here", "password": "x"}, REMOTE_ADDR="10.9.8.7")
    entries = list(AuditEntry.objects.filter(action="login.failed").order_by("id"))
    assert [(e.object_id, e.tenant_id, e.changes) for e in entries] == [
        (str(viewer.pk), tenant_a.pk, {"username": viewer.username}),
        ("", None, {"username": "nobodyhere"}),
    ]
    assert {e.remote_addr for e in entries} == {"10.9.8.7"} and {e.actor_id for e in entries} == {None}
    client.post(
        "/accounts/login/", {"username": viewer.username, "password": PASSWORD}, REMOTE_ADDR="10.9.8.7"
    )
    assert (
        AuditEntry.objects.filter(action="login.failed").count() == 2
    )  # a login that works is not a failure


def test_attempts_refused_by_the_rate_limit_are_audited_once_a_minute(
    client, users, settings, django_capture_on_commit_callbacks
):
    settings.LOGIN_RATE = "2/hour"
    target = users["operator"].username
    for _ in range(6):  # each request commits on its own: the sampling key is set on commit
        with django_capture_on_commit_callbacks(execute=True):
            client.post("/accounts/login/", {"username": target, "password": "wrong"}, REMOTE_ADDR="10.9.8.6")
    assert AuditEntry.objects.filter(action="login.failed", changes__username=target).count() == 2
    throttled = AuditEntry.objects.filter(action="login.throttled")
    assert [(e.changes, e.remote_addr) for e in throttled] == [({"username": target}, "10.9.8.6")]


@pytest.fixture
def running_job(users, tenant_a):
    cluster = make_cluster(driver="simulated")
    make_node(cluster)
    return job_submit(actor=users["tenant-admin"], tenant=tenant_a, cluster=cluster, name="audited", gpus=8)


def report(client, job, token: str, iteration: int):
    return client.post(
        f"/api/v1/jobs/{job.pk}/progress/",
        {"iteration": iteration},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def test_progress_reports_are_audited_per_reporter_and_every_one_that_moves_back(
    running_job, users, django_capture_on_commit_callbacks
):
    job, token = running_job
    client, admin = Client(), Client()
    admin.force_login(users["tenant-admin"])
    reports = [
        lambda: report(client, job, token, 100),
        lambda: report(client, job, token, 200),
        lambda: report(client, job, token, 300),
        lambda: report(client, job, token, 50),  # back: a restart, or a report that is not the job's
        lambda: admin.post(
            f"/api/v1/jobs/{job.pk}/progress/", {"iteration": 60}, content_type="application/json"
        ),
    ]
    for send in reports:  # each request commits on its own: the sampling key is set on commit
        with django_capture_on_commit_callbacks(execute=True):
            assert send().status_code == 200
    entries = list(AuditEntry.objects.filter(action="job.progress", object_id=str(job.pk)).order_by("id"))
    prefix = token.split("_")[1]
    assert [(e.token_prefix, e.actor_id, e.changes["iteration"], e.changes["back"]) for e in entries] == [
        (prefix, None, [0, 100], False),  # the job token's first report
        (prefix, None, [300, 50], True),  # one that moves the job back, always
        ("", users["tenant-admin"].pk, [50, 60], False),  # another reporter's first
    ]
    assert {e.tenant_id for e in entries} == {job.tenant_id}


# --- websockets per user ------------------------------------------------------------------------------------------


async def open_socket(raw: str):
    communicator = WebsocketCommunicator(
        application, "/ws/events/", headers=[(b"authorization", f"Bearer {raw}".encode())]
    )
    connected, code = await communicator.connect(timeout=5)
    assert connected, code
    return communicator, await communicator.receive_json_from(timeout=5)


@pytest.mark.django_db(transaction=True)
async def test_a_user_holds_at_most_ws_max_per_user_sockets(users, settings):
    settings.WS_MAX_PER_USER = 2
    viewer = users["tenant-viewer"]
    _, raw = await sync_to_async(services.token_create)(actor=viewer, owner=viewer, name="ws", scope="read")
    _, other_raw = await sync_to_async(services.token_create)(
        actor=viewer, owner=viewer, name="ws2", scope="read"
    )
    first, hello = await open_socket(raw)
    second, _ = await open_socket(other_raw)  # per user, whichever credential
    assert hello["type"] == "hello"
    third, answer = await open_socket(raw)
    assert answer == {"type": "error", "detail": "at most 2 open websockets per user: close one first"}
    closed = await third.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": consumers.CLOSE_TOO_MANY}
    # Another user is not held back; and a socket closed gives its slot back.
    _, operator_raw = await sync_to_async(services.token_create)(
        actor=users["operator"], owner=users["operator"], name="ws", scope="read"
    )
    elsewhere, hello = await open_socket(operator_raw)
    assert hello["type"] == "hello"
    await first.disconnect()
    fourth, hello = await open_socket(raw)
    assert hello["type"] == "hello"
    for socket in (second, elsewhere, fourth):
        await socket.disconnect()
    await asyncio.sleep(0)


# --- the Django admin's user form ---------------------------------------------------------------------------------


def test_the_admin_shows_users_and_writes_none(client, tenant_a):
    staff = make_user(Role.PROVIDER_ADMIN)
    staff.is_staff = staff.is_superuser = True
    staff.save()
    viewer = make_user(Role.TENANT_VIEWER, tenant_a)
    client.force_login(staff)
    users_before = list(get_user_model().objects.values_list("pk", "username", "is_active", "is_superuser"))
    added = client.post(
        "/admin/auth/user/add/", {"username": "no-role", "password1": "Pa55word!x", "password2": "Pa55word!x"}
    )
    assert added.status_code == 403
    changed = client.post(
        f"/admin/auth/user/{viewer.pk}/change/",
        {"username": viewer.username, "is_active": "", "is_superuser": "on", "is_staff": "on"},
    )
    assert changed.status_code == 403
    assert client.post(f"/admin/auth/user/{viewer.pk}/delete/", {"post": "yes"}).status_code == 403
    password = client.post(f"/admin/auth/user/{viewer.pk}/password/", {"password1": "x", "password2": "x"})
    assert (
        password.status_code == 302 and "password1" not in client.get(password["Location"]).content.decode()
    )
    assert (
        list(get_user_model().objects.values_list("pk", "username", "is_active", "is_superuser"))
        == users_before
    )
    page = client.get(f"/admin/auth/user/{viewer.pk}/change/")
    assert page.status_code == 200 and viewer.username in page.content.decode()
    assert not re.search(r"(md5|pbkdf2_sha256)\$", page.content.decode())  # no password hash shown
    assert client.get("/admin/auth/group/add/").status_code == 403


# --- what the live schemathesis run found (tests/test_fuzz.py) -----------------------------------------------------


def test_answers_the_schema_did_not_document_are_now_documented_or_changed(api, users):
    api.as_token(users["operator"], "write")
    # A body that is not an object: the errors are an object too (were a bare list).
    answer = api.post("/api/v1/faults/", "null", content_type="application/json")
    assert (answer.status_code, answer.json()) == (400, {"non_field_errors": ["This field may not be null."]})
    # An unknown ?format= is a 400 naming the formats (was DRF's 404); a path's unknown suffix stays a 404.
    answer = api.get("/metrics", {"format": "AAA"})
    assert (answer.status_code, answer.json()) == (400, {"format": ["one of json, prometheus"]})
    assert api.get("/api/v1/audit/0.5/").status_code == 404
    paths = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()["paths"]
    # The automation switch's 400 carries field errors, as the answer does; a what-if past its caps is a 429.
    assert api.put("/api/v1/automation/", {}, format="json").json() == {"mode": ["This field is required."]}
    bad_input = paths["/api/v1/automation/"]["put"]["responses"]["400"]["content"]["application/json"][
        "schema"
    ]
    assert bad_input.get("additionalProperties") == {} and "required" not in bad_input
    assert "429" in paths["/api/v1/whatif/"]["post"]["responses"]
