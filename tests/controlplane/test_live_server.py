"""Through a live uvicorn: HTTP and websockets on one port, the way `make run` serves them."""

import json

import pytest
import requests
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.support.factories import token_header

pytestmark = pytest.mark.django_db(transaction=True)


def ws_connect(server, header=None, origin=None):
    headers = {"Authorization": header} if header else {}
    return connect(
        f"ws://127.0.0.1:{server.port}/ws/events/", additional_headers=headers, origin=origin, open_timeout=10
    )


def receive(ws, timeout=5.0):
    return json.loads(ws.recv(timeout=timeout))


@pytest.fixture
def server(tmp_path):
    from tests.support.processes import uvicorn_server

    with uvicorn_server(tmp_path) as running:
        yield running


def test_event_from_an_api_write_reaches_a_websocket_client(server, users, tenant_a):
    admin_header = token_header(users["provider-admin"], "write")["HTTP_AUTHORIZATION"]
    with ws_connect(server, admin_header) as ws:
        assert receive(ws)["type"] == "hello"
        ws.send(json.dumps({"subscribe": ["fleet"]}))
        assert receive(ws)["topics"] == ["fleet"]
        response = requests.post(
            f"{server.url}/api/v1/tenants/",
            json={"name": "Umbrella", "slug": "umbrella"},
            headers={"Authorization": admin_header},
            timeout=10,
        )
        assert response.status_code == 201, response.text
        event = receive(ws)
        assert event["type"] == "event" and event["kind"] == "tenant.created"
        assert (
            event["payload"]["name"] == "Umbrella"
            and event["url"] == f"/api/v1/tenants/{response.json()['id']}/"
        )


def test_tenant_client_is_refused_the_fleet_topic(server, users, tenant_a):
    header = token_header(users["tenant-viewer"], "read")["HTTP_AUTHORIZATION"]
    with ws_connect(server, header) as ws:
        receive(ws)
        ws.send(json.dumps({"subscribe": ["fleet", f"tenant-{tenant_a.pk}"]}))
        reply = receive(ws)
        assert reply["refused"] == ["fleet"] and reply["topics"] == [f"tenant-{tenant_a.pk}"]


def test_cross_site_browser_origin_is_refused(server, users):
    header = token_header(users["provider-admin"], "read")["HTTP_AUTHORIZATION"]
    with pytest.raises(InvalidStatus):
        ws_connect(server, header, origin="http://evil.example")
    with ws_connect(server, header, origin=f"http://localhost:{server.port}") as ws:
        assert receive(ws)["type"] == "hello"


def test_client_that_was_away_catches_up(server, users):
    header = token_header(users["provider-admin"], "write")["HTTP_AUTHORIZATION"]
    auth = {"Authorization": header}
    requests.post(
        f"{server.url}/api/v1/tenants/", json={"name": "First", "slug": "first"}, headers=auth, timeout=10
    )
    with ws_connect(server, header) as ws:
        receive(ws)
        ws.send(json.dumps({"subscribe": ["fleet"]}))
        receive(ws)
        requests.post(
            f"{server.url}/api/v1/tenants/",
            json={"name": "Second", "slug": "second"},
            headers=auth,
            timeout=10,
        )
        last_seen = receive(ws)["seq"]
    # Away: two more changes happen.
    for name in ("Third", "Fourth"):
        requests.post(
            f"{server.url}/api/v1/tenants/",
            json={"name": name, "slug": name.lower()},
            headers=auth,
            timeout=10,
        )
    missed = requests.get(
        f"{server.url}/api/v1/events/",
        params={"topic": "fleet", "after": last_seen},
        headers=auth,
        timeout=10,
    ).json()["results"]
    assert [e["payload"]["name"] for e in missed] == ["Third", "Fourth"]
    assert [e["seq"] for e in missed] == [last_seen + 1, last_seen + 2]


def test_login_page_and_offline_assets_are_served(server, db):
    page = requests.get(f"{server.url}/accounts/login/", timeout=10)
    assert page.status_code == 200 and "Log in to Lockstep" in page.text
    plotly = requests.get(f"{server.url}/static/vendor/plotly.min.js", timeout=10)
    assert plotly.status_code == 200 and len(plotly.content) > 1_000_000
    docs = requests.get(f"{server.url}/api/docs/", timeout=10)
    assert docs.status_code == 200 and "cdn" not in docs.text.lower()
    assert "/static/drf_spectacular_sidecar/" in docs.text
