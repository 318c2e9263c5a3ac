"""Rate limits on the login form and on token issue: the attempt past the limit is answered 429 with Retry-After,
before the password is checked, and other users (and other addresses) are not held back."""

import itertools

import pytest
from django.test import Client, override_settings

from tenancy.models import ApiToken
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db
PASSWORD = "correct-horse-9"
_addresses = itertools.count(1)


@pytest.fixture
def address():
    """A client address of this test's own, so the counts of other tests (and the suite's 127.0.0.1) stay apart."""
    n = next(_addresses)
    return f"10.77.{n // 250}.{n % 250 + 1}"


def log_in(client: Client, address: str, username: str, password: str):
    return client.post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


@override_settings(LOGIN_RATE="3/hour")
def test_the_login_attempt_past_the_limit_is_refused_even_with_the_right_password(client, users, address):
    victim = users["operator"]
    for _ in range(3):
        response = log_in(client, address, victim.username, "wrong")
        assert response.status_code == 200 and "did not match" in response.content.decode()
    refused = log_in(client, address, victim.username, PASSWORD)
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 3600
    assert "Too many login attempts" in refused.content.decode()
    assert "_auth_user_id" not in client.session  # not logged in: the password was never checked


@override_settings(LOGIN_RATE="3/hour")
def test_other_users_and_other_addresses_are_not_affected(users, address):
    attacker, bystander, elsewhere = Client(), Client(), Client()
    target = users["operator"]
    for _ in range(4):
        log_in(attacker, address, target.username, "wrong")
    assert log_in(attacker, address, target.username, PASSWORD).status_code == 429
    # Another user from the same address logs in.
    other = users["tenant-admin"]
    assert log_in(bystander, address, other.username, PASSWORD)["Location"] == "/"
    # The targeted user, from another address, logs in too: nobody can lock a user out from elsewhere.
    assert log_in(elsewhere, f"{address}9", target.username, PASSWORD)["Location"] == "/"


@override_settings(LOGIN_RATE="100/hour", LOGIN_ADDRESS_RATE="5/hour")
def test_one_address_cannot_try_many_user_names(client, users, address):
    statuses = [log_in(client, address, f"guess-{n}", "wrong").status_code for n in range(6)]
    assert statuses == [200] * 5 + [429]
    assert log_in(Client(), f"{address}9", users["operator"].username, PASSWORD).status_code == 302


def test_the_admin_login_goes_through_the_limited_form(client):
    response = client.get("/admin/login/?next=/admin/")
    assert response.status_code == 302 and response["Location"] == "/accounts/login/?next=/admin/"


@override_settings(TOKEN_CREATE_RATE="3/hour")
def test_the_token_created_past_the_limit_is_refused_through_the_api(api, users):
    api.as_token(users["tenant-admin"])
    before = ApiToken.objects.count()
    for n in range(3):
        assert api.post("/api/v1/tokens/", {"name": f"t{n}"}, format="json").status_code == 201
    refused = api.post("/api/v1/tokens/", {"name": "one-too-many"}, format="json")
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 3600
    assert "throttled" in refused.json()["detail"]
    assert ApiToken.objects.count() == before + 3
    # Listing and revoking are not counted; another user still creates tokens.
    assert api.get("/api/v1/tokens/").status_code == 200
    api.as_token(users["tenant-viewer"])
    assert api.post("/api/v1/tokens/", {"name": "mine"}, format="json").status_code == 201


@override_settings(TOKEN_CREATE_RATE="3/hour")
def test_agent_tokens_issued_and_rotated_count_against_the_same_limit(api, users):
    from fleet.models import Cluster, Fleet
    from telemetry.models import AgentToken

    cluster = Cluster.objects.create(fleet=Fleet.objects.create(name="rl"), name="rl-1")
    api.as_token(users["provider-admin"])
    first = api.post("/api/v1/agent-tokens/", {"cluster": cluster.pk, "name": "a0"}, format="json")
    assert first.status_code == 201
    assert (
        api.post("/api/v1/agent-tokens/", {"cluster": cluster.pk, "name": "a1"}, format="json").status_code
        == 201
    )
    assert api.post(f"/api/v1/agent-tokens/{first.json()['id']}/rotate/").status_code == 201
    refused = api.post("/api/v1/agent-tokens/", {"cluster": cluster.pk, "name": "a2"}, format="json")
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert api.post(f"/api/v1/agent-tokens/{first.json()['id']}/rotate/").status_code == 429
    assert AgentToken.objects.filter(cluster=cluster).count() == 3  # two issued, one reissued by the rotation
    assert api.get("/api/v1/agent-tokens/").status_code == 200


@override_settings(TOKEN_CREATE_RATE="2/hour")
def test_the_token_page_answers_429_past_the_limit(client, users):
    client.force_login(users["tenant-viewer"])
    for n in range(2):
        assert client.post("/tokens/", {"name": f"p{n}", "scope": "read"}).status_code == 200
    refused = client.post("/tokens/", {"name": "p3", "scope": "read"})
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert "Too many tokens created" in refused.content.decode()
    assert ApiToken.objects.filter(user=users["tenant-viewer"]).count() == 2


def test_the_limits_step_aside_when_redis_is_unreachable(client, users, address, caplog):
    unreachable = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
            "OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2},
        }
    }
    with override_settings(CACHES=unreachable):
        response = log_in(client, address, users["operator"].username, PASSWORD)
    assert response.status_code == 302 and response["Location"] == "/"
    assert "Redis unreachable" in caplog.text
