"""Error pages (issue 47, item 5): 400, 403, 404 and 500 in the site's layout, with DEBUG on (``make run``) as
with it off; everything under /api/ answers JSON ``{"detail": …}`` with the right status, unknown routes, 405s
and server errors included. The module is its own URLconf for the tests that need a view that fails."""

import json
import logging

import pytest
from django.core.exceptions import SuspiciousOperation
from django.http import HttpResponseNotAllowed
from django.test import Client, RequestFactory, override_settings
from django.urls import path

from controlplane.error_pages import ApiErrorMiddleware, server_error
from controlplane.urls import handler400, handler403, handler404, handler500  # noqa: F401 - this URLconf's
from controlplane.urls import urlpatterns as site_patterns


def boom(request):
    raise RuntimeError("the view broke")


def suspicious(request):
    raise SuspiciousOperation("a forged value")


urlpatterns = [
    path("boom/", boom),
    path("api/v1/boom/", boom),
    path("suspicious/", suspicious),
    *site_patterns,
]

DEBUG = pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
# What Django's debug pages say, and what only ours say.
DJANGO_DEBUG_404 = "Using the URLconf"
DJANGO_DEBUG_500 = "Traceback"
NAV = '<nav aria-label="Main">'
HOME_LINK = '<a href="/">Go to the home page</a>'


def body(response) -> str:
    return response.content.decode()


def styled(response, status: int, *, nav: bool = True) -> str:
    text = body(response)
    assert response.status_code == status, (response.status_code, text[:300])
    assert response["Content-Type"].startswith("text/html")
    assert f"Error {status}" in text and HOME_LINK in text and 'class="brand"' in text
    assert (NAV in text) is nav
    assert DJANGO_DEBUG_404 not in text and DJANGO_DEBUG_500 not in text and "technical" not in text
    return text


def json_error(response, status: int) -> dict:
    assert response.status_code == status, (response.status_code, body(response)[:300])
    assert response["Content-Type"] == "application/json", response["Content-Type"]
    data = json.loads(response.content)
    assert set(data) == {"detail"} and data["detail"], data
    return data


@pytest.mark.django_db
@DEBUG
def test_an_unknown_page_is_the_site_404_with_its_navigation(client, users, debug):
    client.force_login(users["operator"])
    with override_settings(DEBUG=debug):
        text = styled(client.get("/no-such-page/"), 404)
        assert "Page not found" in text
        # A missing object is the same page.
        styled(client.get("/clusters/999999/"), 404)
        # Without the slash, the pattern with one still wins (CommonMiddleware's redirect), page or API.
        assert client.get("/clusters").status_code == 301
        assert client.get("/api/v1/clusters").status_code == 301


@pytest.mark.django_db
def test_the_anonymous_404_is_styled_without_navigation(client):
    with override_settings(DEBUG=True):
        styled(client.get("/no-such-page/"), 404, nav=False)


@pytest.mark.django_db
@DEBUG
def test_a_tenant_on_a_provider_page_gets_the_site_403(client, users, debug):
    client.force_login(users["tenant-viewer"])
    with override_settings(DEBUG=debug):
        text = styled(client.get("/blueprints/"), 403)
    assert "Not allowed" in text and "blueprints" in text.lower()


@pytest.mark.django_db
def test_a_stale_csrf_token_is_the_site_403(users):
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["operator"])
    text = styled(client.post("/automation/", {"mode": "paused"}), 403)
    assert "CSRF verification failed" in text
    # Under /api/ the same refusal is JSON.
    assert "CSRF" in json_error(client.put("/api/v1/automation/", {"mode": "paused"}), 403)["detail"]


@pytest.mark.django_db
@DEBUG
@pytest.mark.parametrize(
    "url", ["/api/v1/no-such/", "/api/nothing", "/api/v1/clusters/abc/", "/api/v1/jobs/1/no-such-action/"]
)
def test_unknown_api_routes_answer_json_404(client, users, debug, url):
    client.force_login(users["operator"])
    with override_settings(DEBUG=debug):
        assert json_error(client.get(url), 404) == {"detail": "Not found."}
        assert json_error(Client().get(url), 404) == {"detail": "Not found."}  # anonymous alike


@pytest.mark.django_db
@DEBUG
def test_a_method_the_api_does_not_take_answers_json_405(client, users, debug):
    client.force_login(users["provider-admin"])
    with override_settings(DEBUG=debug):
        response = client.delete("/api/v1/automation/")
        assert json_error(response, 405) == {"detail": 'Method "DELETE" not allowed.'}
        # The schema view renders its errors as YAML of its own; the answer is JSON all the same.
        response = client.post("/api/schema/")
        assert json_error(response, 405) == {"detail": 'Method "POST" not allowed.'}
        assert "GET" in response["Allow"]


def test_a_plain_views_405_under_the_api_becomes_json_and_keeps_its_headers():
    def view(request):
        response = HttpResponseNotAllowed(["GET", "HEAD"])
        response["Content-Length"] = "0"
        response.set_cookie("kept", "1")
        return response

    response = ApiErrorMiddleware(view)(RequestFactory().post("/api/v1/anything/"))
    assert json_error(response, 405) == {"detail": 'Method "POST" not allowed.'}
    assert response["Allow"] == "GET, HEAD" and response.cookies["kept"].value == "1"
    assert int(response["Content-Length"]) == len(response.content)
    # A page's answer is left as it was.
    page = ApiErrorMiddleware(view)(RequestFactory().post("/clusters/"))
    assert page.status_code == 405 and page.content == b""


@pytest.mark.django_db
@pytest.mark.urls(__name__)
@DEBUG
def test_a_server_error_is_the_site_500_and_the_traceback_goes_to_the_log(users, debug, caplog):
    client = Client(raise_request_exception=False)
    client.force_login(users["operator"])
    with override_settings(DEBUG=debug), caplog.at_level(logging.ERROR, logger="django.request"):
        text = styled(client.get("/boom/"), 500, nav=False)
        assert "Something went wrong" in text and "the view broke" not in text
        assert json_error(client.get("/api/v1/boom/"), 500) == {"detail": "Server error."}
    logged = [record for record in caplog.records if record.name == "django.request" and record.exc_info]
    assert len(logged) == 2 and all("the view broke" in str(record.exc_info[1]) for record in logged)


@pytest.mark.django_db
@pytest.mark.urls(__name__)
@DEBUG
def test_a_suspicious_request_is_the_site_400(users, debug):
    client = Client(raise_request_exception=False)
    with override_settings(DEBUG=debug):
        text = styled(client.get("/suspicious/"), 400, nav=False)
    assert "a forged value" not in text


@pytest.mark.django_db
def test_a_request_for_another_host_under_the_api_is_json_400(client):
    json_error(client.get("/api/v1/clusters/", HTTP_HOST="evil.example"), 400)
    with override_settings(DEBUG=True):
        json_error(client.get("/api/v1/clusters/", HTTP_HOST="evil.example"), 400)


def test_the_500_page_needs_no_database():
    """No database access is allowed in this test (no django_db mark): rendering must not query."""
    response = server_error(RequestFactory().get("/anything/"))
    assert response.status_code == 500 and "Something went wrong" in body(response)
    assert json_error(server_error(RequestFactory().get("/api/v1/anything/")), 500)


@pytest.mark.django_db
@pytest.mark.urls(__name__)
def test_debug_error_pages_brings_back_djangos_own(users):
    client = Client(raise_request_exception=False)
    client.force_login(users["operator"])
    with override_settings(DEBUG=True, DEBUG_ERROR_PAGES=True):
        assert DJANGO_DEBUG_404 in body(client.get("/no-such-page/"))
        assert DJANGO_DEBUG_500 in body(client.get("/boom/"))
