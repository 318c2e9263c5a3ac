"""Production settings: `check --deploy` is clean with DEBUG off, a served page carries HTTPS-only headers and
Secure cookies, and every form is CSRF-protected."""

import json
import os
import re
import secrets
import subprocess
from pathlib import Path

import pytest
import requests
from django.conf import settings
from django.test import Client

from tests.support.processes import manage_py, uvicorn_server

PRODUCTION = {
    "PATH": os.environ["PATH"],
    "DJANGO_SETTINGS_MODULE": "controlplane.settings",
    "DATABASE_URL": "postgres://lockstep:secret@db.internal:5432/lockstep",
    "REDIS_URL": "redis://redis.internal:6379/0",
    "ALLOWED_HOSTS": "lockstep.example.com",
    "SECRET_KEY": secrets.token_urlsafe(50),
}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    return manage_py(*args, env={**PRODUCTION, **env})


def production_settings(**env: str) -> dict:
    code = (
        "import json; from django.conf import settings as s; print(json.dumps({n: getattr(s, n) for n in ["
        "'DEBUG', 'SECURE_SSL_REDIRECT', 'SECURE_HSTS_SECONDS', 'SECURE_HSTS_INCLUDE_SUBDOMAINS', "
        "'SECURE_HSTS_PRELOAD', 'SECURE_PROXY_SSL_HEADER', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE']}))"
    )
    result = manage("shell", "-c", code, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_check_deploy_is_clean_in_production():
    result = manage("check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_reports_plain_http_so_its_silence_means_something():
    result = manage("check", "--deploy", "--fail-level", "WARNING", PLAIN_HTTP="true")
    assert result.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in result.stderr + result.stdout, warning


def test_production_refuses_to_start_without_a_secret_key():
    env = dict(PRODUCTION)
    del env["SECRET_KEY"]
    result = manage_py("check", env=env)
    assert result.returncode != 0 and "SECRET_KEY must be set when DEBUG is off" in result.stderr


def test_the_environment_tunes_hsts_and_the_proxy_header():
    assert production_settings() == {
        "DEBUG": False,
        "SECURE_SSL_REDIRECT": True,
        "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_HSTS_PRELOAD": True,
        "SECURE_PROXY_SSL_HEADER": None,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
    }
    tuned = production_settings(SECURE_HSTS_SECONDS="300", TRUST_X_FORWARDED_PROTO="true")
    assert tuned["SECURE_HSTS_SECONDS"] == 300
    assert tuned["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    local = production_settings(PLAIN_HTTP="true")
    assert not local["SECURE_SSL_REDIRECT"] and local["SECURE_HSTS_SECONDS"] == 0
    assert not local["SESSION_COOKIE_SECURE"] and not local["CSRF_COOKIE_SECURE"]


@pytest.mark.django_db(transaction=True)
def test_a_production_server_speaks_https_only(tmp_path):
    with uvicorn_server(tmp_path, PLAIN_HTTP="false") as server:
        plain = requests.get(f"{server.url}/accounts/login/", allow_redirects=False, timeout=10)
        assert plain.status_code == 301 and plain.headers["Location"].startswith("https://")
        assert (
            requests.get(f"{server.url}/healthz", timeout=10).status_code == 200
        )  # probes stay on plain HTTP
        # Through a TLS proxy (uvicorn trusts the X-Forwarded-Proto of one on 127.0.0.1: --forwarded-allow-ips).
        page = requests.get(
            f"{server.url}/accounts/login/", headers={"X-Forwarded-Proto": "https"}, timeout=10
        )
    assert page.status_code == 200
    assert page.headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
    assert page.headers["X-Frame-Options"] == "DENY" and page.headers["X-Content-Type-Options"] == "nosniff"
    assert page.headers["Referrer-Policy"] == "same-origin"
    assert page.headers["Cross-Origin-Opener-Policy"] == "same-origin"
    # django-csp orders the directives as a set does (differently in every process): compare them parsed.
    policy = dict(
        directive.strip().split(" ", 1) for directive in page.headers["Content-Security-Policy"].split(";")
    )
    assert policy["script-src"] == "'self'"
    assert f"wss://127.0.0.1:{server.port}" in policy["connect-src"].split()
    cookie = page.headers["Set-Cookie"]
    assert cookie.startswith("csrftoken=") and "Secure" in cookie and "SameSite=Lax" in cookie


def test_every_form_that_posts_carries_a_csrf_token():
    forms = 0
    for template in Path(settings.BASE_DIR, "templates").rglob("*.html"):
        for form in re.findall(r"<form\b.*?</form>", template.read_text(), re.DOTALL | re.IGNORECASE):
            if re.search(r"method=[\"']?post", form, re.IGNORECASE):
                forms += 1
                assert "{% csrf_token %}" in form, f"{template}: a POST form without {{% csrf_token %}}"
    assert forms >= 8


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path, data",
    [
        ("/accounts/login/", {"username": "x", "password": "y"}),
        ("/accounts/logout/", {}),
        ("/tokens/", {"name": "n", "scope": "read"}),
    ],
)
def test_a_form_post_without_its_csrf_token_is_refused(users, path, data):
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["tenant-admin"])
    assert client.post(path, data).status_code == 403


@pytest.mark.django_db
def test_session_authenticated_api_writes_need_the_csrf_token(users):
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["tenant-admin"])
    refused = client.post("/api/v1/tokens/", {"name": "n"}, content_type="application/json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
