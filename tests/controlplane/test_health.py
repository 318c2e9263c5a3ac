import time

import pytest
import requests

from tests.support.processes import free_port, uvicorn_server

pytestmark = pytest.mark.django_db


def test_healthz_answers(client):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_readyz_reports_each_check_and_no_worker_is_still_ready(client):
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ready"
    assert body["checks"]["database"]["ok"] and body["checks"]["redis"]["ok"]
    assert body["workers"] == {"ok": False, "count": 0, "affects_readiness": False}
    assert body["beat"]["ok"] is False


def test_readyz_goes_503_when_redis_stops_and_back_when_it_returns(client, settings, private_redis):
    settings.REDIS_URL = private_redis.url
    assert client.get("/readyz").status_code == 200
    private_redis.stop()
    started = time.monotonic()
    response = client.get("/readyz")
    elapsed = time.monotonic() - started
    assert response.status_code == 503
    body = response.json()
    assert body["checks"]["redis"]["ok"] is False and body["checks"]["redis"]["error"]
    assert body["checks"]["database"]["ok"] is True
    assert elapsed < settings.READYZ_TIMEOUT * 2 + 1
    private_redis.start()
    assert client.get("/readyz").status_code == 200


def test_readyz_goes_503_when_the_database_does_not_answer(tmp_path):
    dead = f"postgres://postgres@127.0.0.1:{free_port()}/nothing"
    with uvicorn_server(tmp_path, DATABASE_URL=dead) as server:
        response = requests.get(f"{server.url}/readyz", timeout=10)
        assert response.status_code == 503
        body = response.json()
        assert body["checks"]["database"]["ok"] is False
        assert body["checks"]["redis"]["ok"] is True
        assert requests.get(f"{server.url}/healthz", timeout=5).status_code == 200
