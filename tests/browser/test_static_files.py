"""Static files after collectstatic, in a real browser (issue 47): the provider home's plotly.js bundle and style
sheets arrive gzip-compressed under content-hashed names with a far-future Cache-Control, the charts still draw,
and the content security policy still holds, with DEBUG on (`make run`) and off (the image). Without a collected
tree the pages link the sources, as every other browser test serves them."""

import subprocess
import sys

import pytest
import requests
from django.contrib.auth import get_user_model

from simulator.world import world_build
from tests.support.browser import Watcher, log_in, usable_password
from tests.support.processes import BASE_DIR, child_env, uvicorn_server

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-9"
SETTINGS = "controlplane.testing.collected_static"
FOREVER = "max-age=315360000"


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """A static tree collected as `make run` collects it, in a folder of this module's own."""
    root = tmp_path_factory.mktemp("static")
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=BASE_DIR,
        env=child_env(DJANGO_SETTINGS_MODULE=SETTINGS, LOCKSTEP_STATIC_ROOT=root),
        check=True,
        timeout=120,
    )
    return root


@pytest.fixture
def admin():
    world_build(seed=5, nodes_per_cluster=8, spares=2)
    user = get_user_model().objects.get(username="lockstep-simulator")
    usable_password(user, PASSWORD)
    return user


def static_responses(page) -> dict[str, object]:
    """Every /static/ response the page gets, by URL."""
    seen: dict[str, object] = {}
    page.on(
        "response",
        lambda response: seen.setdefault(response.url, response) if "/static/" in response.url else None,
    )
    return seen


@pytest.mark.parametrize("debug", ["true", "false"])
def test_home_page_static_files_are_compressed_cached_and_charts_draw(
    page, tmp_path, collected, admin, debug
):
    environment = {"DJANGO_SETTINGS_MODULE": SETTINGS, "LOCKSTEP_STATIC_ROOT": collected, "DEBUG": debug}
    with uvicorn_server(
        tmp_path, LOGIN_RATE="1000/min", LOGIN_ADDRESS_RATE="1000/min", **environment
    ) as server:
        watcher = Watcher(page)
        log_in(page, server.url, admin.username, PASSWORD)
        responses = static_responses(page)
        status, _, violations = watcher.visit(f"{server.url}/")
        assert status == 200
        page.wait_for_selector(".heatmap .main-svg", timeout=10_000)
        assert violations == []
        plotly = [url for url in responses if "/static/vendor/plotly.min." in url]
        sheets = [url for url in responses if "/static/css/" in url and url.endswith(".css")]
        assert len(plotly) == 1 and sheets, sorted(responses)
        for url in plotly + sheets:
            headers = responses[url].all_headers()
            assert responses[url].status == 200, url
            assert headers.get("content-encoding") in ("gzip", "br"), (url, headers)
            assert FOREVER in headers.get("cache-control", "") and "immutable" in headers["cache-control"], (
                url,
                headers,
            )
        # The cartesian bundle, not the full one: a third of its size.
        assert len(responses[plotly[0]].body()) < 2_000_000
        # Asked without compression, the same file is served whole.
        plain = requests.get(plotly[0], headers={"Accept-Encoding": "identity"}, timeout=10)
        assert plain.status_code == 200 and "content-encoding" not in plain.headers
        assert len(plain.content) == len(responses[plotly[0]].body())


def test_without_a_collected_tree_pages_link_the_sources(page, tmp_path, admin):
    empty = tmp_path / "static"
    empty.mkdir()
    environment = {"DJANGO_SETTINGS_MODULE": SETTINGS, "LOCKSTEP_STATIC_ROOT": empty}
    with uvicorn_server(
        tmp_path, LOGIN_RATE="1000/min", LOGIN_ADDRESS_RATE="1000/min", **environment
    ) as server:
        log_in(page, server.url, admin.username, PASSWORD)
        page.goto(f"{server.url}/")
        page.wait_for_selector(".heatmap .main-svg", timeout=10_000)
        sources = page.eval_on_selector_all("script[src]", "els => els.map(e => e.getAttribute('src'))")
    assert "/static/vendor/plotly.min.js" in sources
