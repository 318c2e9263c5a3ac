"""Secrets never reach a log: the redaction of single records, and a live server logging at its most verbose
(uvicorn's ASGI trace and Django at DEBUG) while it is sent every kind of secret."""

import io
import json
import logging
import re
import subprocess
import time

import pytest
import requests
from django.apps import apps
from uvicorn.logging import AccessFormatter
from websockets.sync.client import connect

from controlplane.security_logging import RedactSecretsFilter, redact
from telemetry.services.tokens import agent_token_create
from tenancy.models import Token
from tenancy.tokens import generate
from tests.support.browser import usable_password
from tests.support.factories import make_cluster, make_fleet, make_node, token_header
from tests.support.processes import BASE_DIR, VENV_BIN, _stop, child_env, free_port, wait_for
from tests.support.telemetry import batch, reading

API_TOKEN = "lsk_abcd1234_QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWY"
AGENT_TOKEN = "lsa_wxyz9876_YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXpBQkNERUY"
JOB_TOKEN = "lsj_q1w2e3r4_MTIzNDU2Nzg5MGFiY2RlZmdoaWprbG1ub3BxcnN0dXY"
LAUNCHER_CREDENTIAL = "lsl_m5n6b7v8_bGF1bmNoZXJjcmVkZW50aWFsc2VjcmV0MDEyMzQ1Njc4OQ"


@pytest.mark.parametrize(
    "text, secret",
    [
        (f"GET /ws/events/?token={API_TOKEN}", API_TOKEN[13:]),
        (f"Authorization: Bearer {AGENT_TOKEN}", AGENT_TOKEN[13:]),
        (f"progress from {JOB_TOKEN}", JOB_TOKEN[13:]),
        (f"job 4242 registered by {LAUNCHER_CREDENTIAL}", LAUNCHER_CREDENTIAL[13:]),
        ("Authorization: Basic dXNlcjpodW50ZXIy", "dXNlcjpodW50ZXIy"),
        ("headers=[(b'authorization', b'Basic dXNlcjpodW50ZXIy'), (b'host', b'x')]", "dXNlcjpodW50ZXIy"),
        ("headers=[(b'cookie', b'csrftoken=c5rf7ok3n; sessionid=s3ss10nid')]", "s3ss10nid"),
        ('{"username": "bob", "password": "correct horse battery"}', "horse"),
        ("username=bob&password=hunter2&next=/", "hunter2"),
        ("{'connection': {'token': 'k8s-t0ken', 'client-key-data': 'LS0tLS1CRUdJTg=='}}", "k8s-t0ken"),
        ("{'connection': {'token': 'k8s-t0ken', 'client-key-data': 'LS0tLS1CRUdJTg=='}}", "LS0tLS1CRUdJTg=="),
        (
            "kubeconfig: |\n  -----BEGIN EC PRIVATE KEY-----\n  MHcCAQEEIB\n  -----END EC PRIVATE KEY-----",
            "MHcCAQEEIB",
        ),
        ("sa eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLWJ5dGVz", "c2lnbmF0dXJlLWJ5dGVz"),
    ],
)
def test_redact_removes_each_kind_of_secret(text, secret):
    assert secret in text
    redacted = redact(text)
    assert secret not in redacted and "***" in redacted
    assert redact(redacted) == redacted  # idempotent


def test_redact_keeps_what_is_not_secret():
    for text in [
        "Token has been revoked.",
        "GET /api/v1/clusters/?page=2 200",
        "lsk_abcd1234_… revoked",
        "job 17 checkpoint saved",
    ]:
        assert redact(text) == text
    assert redact(f"Bearer {API_TOKEN}").endswith("lsk_abcd1234_***")  # the prefix names the token


def test_records_are_redacted_as_they_are_made(caplog):
    log = logging.getLogger("tests.security")
    with caplog.at_level(logging.DEBUG, logger="tests.security"):
        log.debug("request headers %s", {"Authorization": f"Bearer {API_TOKEN}"})
        log.info("login %s with password=%s", "bob", "hunter2")
        log.info(
            "cluster %(name)s connection %(connection)r", {"name": "c1", "connection": {"token": "k8s-t0ken"}}
        )
        try:
            raise ValueError(f"refused token {AGENT_TOKEN}")
        except ValueError:
            log.exception("ingest failed")
    text = caplog.text
    assert "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWY" not in text and "hunter2" not in text
    assert "k8s-t0ken" not in text and AGENT_TOKEN[13:] not in text
    assert "login bob with password=***" in text and "cluster c1 connection" in text and "ValueError" in text


def test_a_launcher_credential_logged_is_masked(caplog):
    log = logging.getLogger("tests.security")
    with caplog.at_level(logging.INFO, logger="tests.security"):
        log.info("launcher registered with %s for job %s", LAUNCHER_CREDENTIAL, "4242")
    assert LAUNCHER_CREDENTIAL[13:] not in caplog.text
    assert "launcher registered with lsl_m5n6b7v8_*** for job 4242" in caplog.text


def test_every_kind_of_token_lockstep_mints_is_masked():
    kinds = {model.kind for model in apps.get_models() if issubclass(model, Token)}
    assert {"lsk", "lsa", "lsj", "lsl"} <= kinds
    for kind in sorted(kinds):
        raw, prefix, _ = generate(kind)
        assert redact(f"token {raw} used") == f"token {kind}_{prefix}_*** used", kind


def test_uvicorns_access_log_keeps_its_shape():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s', use_colors=False)
    )
    log = logging.getLogger("tests.security.access")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", f"/ws/events/?token={API_TOKEN}", "1.1", 101
        )
    finally:
        log.removeHandler(handler)
    assert stream.getvalue().startswith('127.0.0.1:5000 - "GET /ws/events/?token=*** HTTP/1.1" 101')


def test_the_filter_redacts_records_made_elsewhere():
    record = logging.makeLogRecord({"msg": "forwarded: %s", "args": (f"Bearer {API_TOKEN}",)})
    assert RedactSecretsFilter().filter(record) is True
    assert record.getMessage() == "forwarded: Bearer lsk_abcd1234_***"


# --- a live server at its most verbose -------------------------------------------------------------------------


@pytest.fixture
def verbose_server(tmp_path):
    """uvicorn at trace level (it logs each ASGI scope and message) with Django's LOG_LEVEL=DEBUG."""
    port = free_port()
    log = tmp_path / "uvicorn-trace.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                str(VENV_BIN / "uvicorn"),
                "controlplane.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "trace",
            ],
            cwd=BASE_DIR,
            env=child_env(LOG_LEVEL="DEBUG"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok, 30, what="uvicorn")
        yield f"http://127.0.0.1:{port}", process, log
    finally:
        _stop(process)


@pytest.mark.django_db(transaction=True)
def test_a_verbose_server_logs_no_secret(verbose_server, users):
    base, process, log = verbose_server
    password = "Unique-Pa55word-7f3a9c"
    admin = users["provider-admin"]
    usable_password(admin, password)
    secrets = {password}

    # A login through the form.
    session = requests.Session()
    form = session.get(f"{base}/accounts/login/", timeout=20).text
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    logged_in = session.post(
        f"{base}/accounts/login/",
        timeout=20,
        data={"username": admin.username, "password": password, "csrfmiddlewaretoken": csrf},
    )
    assert logged_in.ok and "/accounts/login/" not in logged_in.url
    secrets.add(session.cookies["sessionid"])

    # A token-authenticated API call, and a websocket that passes its token in the query string.
    header = token_header(admin, "write")["HTTP_AUTHORIZATION"]
    api_token = header.split()[1]
    secrets.add(api_token.split("_", 2)[2])
    assert requests.get(f"{base}/api/v1/clusters/", headers={"Authorization": header}, timeout=20).ok
    with connect(
        f"ws://127.0.0.1:{base.rsplit(':', 1)[1]}/ws/events/?token={api_token}", open_timeout=10
    ) as ws:
        assert json.loads(ws.recv(timeout=5))["type"] == "hello"

    # A cluster created with credentials.
    fleet = make_fleet()
    credentials = {
        "kubeconfig": "/etc/lockstep/k.yaml",
        "token": "cluster-bearer-9d8c7b",
        "password": "bmc-Pw-42",
    }
    secrets.update({"cluster-bearer-9d8c7b", "bmc-Pw-42"})
    created = requests.post(
        f"{base}/api/v1/clusters/",
        headers={"Authorization": header},
        timeout=20,
        json={"name": "logged-1", "fleet": fleet.pk, "connection": credentials},
    )
    assert created.status_code == 201, created.text

    # An agent's telemetry, with its agent token.
    cluster = make_cluster()
    node = make_node(cluster, "trace-node-1", gpus=2, nics=0)
    _, agent_token = agent_token_create(actor=admin, cluster=cluster, name="trace-agent")
    secrets.add(agent_token.split("_", 2)[2])
    body = batch(node.hostname, readings=[reading(g) for g in range(2)])
    ingested = requests.post(
        f"{base}/api/v1/ingest/telemetry/",
        json=body,
        timeout=20,
        headers={"Authorization": f"Bearer {agent_token}"},
    )
    assert ingested.status_code in (200, 202), ingested.text

    time.sleep(0.5)
    _stop(process)
    text = log.read_text(errors="replace")
    # The log did record these requests, the websocket's query string with its token among them ...
    assert "ASGI" in text and "/api/v1/ingest/telemetry/" in text and "/api/v1/clusters/" in text
    assert "WebSocket /ws/events/?token=***" in text and "'query_string': b'token=***'" in text
    # ... and no secret.
    leaked = sorted(secret for secret in secrets if secret in text)
    assert leaked == [], f"secrets in the log: {leaked}"
