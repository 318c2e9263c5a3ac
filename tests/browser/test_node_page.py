"""The node page in a real browser: per-GPU (memory included) and per-NIC time charts drawn from the telemetry its agent sent (through
the real ingest), an Xid and its recovery marked on the charts' time axis, the range changed from the picker,
no script or style refused by the CSP, and axe with no serious finding."""

import pytest
from django.contrib.auth import get_user_model

from controlplane.access import Role
from tests.support.axe import axe_serious
from tests.support.browser import log_in, screenshot, usable_password
from tests.support.factories import make_cluster, make_node, make_user
from tests.support.node_telemetry import node_with_an_xid

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-9"
User = get_user_model()


@pytest.fixture
def node():
    """A node with two hours of telemetry (a reading every 30 s), an Xid 20 minutes ago and the reset it got."""
    return node_with_an_xid(make_cluster(), "gpu-node-7", gpus=8, nics=4, minutes=120, xid_gpu=3)


def test_node_page_charts_with_fault_markers_and_a_range_change(page, server, node):
    operator = make_user(Role.OPERATOR)
    usable_password(operator, PASSWORD)
    refused, errors = [], []
    page.on("console", lambda message: refused.append(message.text) if "Refused" in message.text else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    log_in(page, server.url, operator.username, PASSWORD)
    page.goto(f"{server.url}/nodes/{node.pk}/?range=6h")
    temperature = page.locator("#chart-temperature")
    temperature.locator(".main-svg").first.wait_for()
    # eight GPUs, one line each; the Xid and the reset as lines on the chart and points on the strip
    assert temperature.locator(".scatterlayer .trace").count() == 8
    assert page.locator("#telemetry-empty, #nic-empty").count() == 0
    assert temperature.locator(".shapelayer path").count() == 2
    strip = page.locator("#chart-events")
    assert strip.get_attribute("data-markers") == "2"
    assert strip.locator(".scatterlayer .point").count() == 2
    assert "gpu_xid 79 on gpu3" in page.locator("#chart-events-summary").inner_text()
    for metric in ("power", "utilization", "ecc"):
        assert page.locator(f"#chart-{metric} .scatterlayer .trace").count() >= 8
    memory = page.locator("#chart-memory")
    assert memory.locator(".scatterlayer .trace").count() == 8 and memory.get_attribute("data-series") == "8"
    assert page.locator("#nic-charts").get_attribute("data-mode") == "series"
    assert page.locator("#nic-charts .nic-chart.js-plotly-plot").count() == 4
    throughput = page.locator('#nic-charts [data-group="bytes"]')
    assert throughput.locator(".scatterlayer .trace").count() == 8  # received, sent per NIC
    assert throughput.locator(".shapelayer path").count() == 2  # the Xid and the reset, on the same axis
    for group in ("errors", "drops", "link changes"):
        chart = page.locator(f'#nic-charts [data-group="{group}"]')
        assert chart.get_attribute("data-series") == ("0" if group == "drops" else "4"), group
    screenshot(page, "node-telemetry-6h")
    assert axe_serious(page) == []

    # The last hour, from the picker: fewer minutes, the same markers, the choice shown as current.
    page.locator('[data-time-range] a[data-range="1h"]').click()
    page.wait_for_url(f"{server.url}/nodes/{node.pk}/?range=1h")
    page.locator("#chart-temperature .main-svg").first.wait_for()
    assert page.locator('[data-time-range] a[aria-current="true"]').get_attribute("data-range") == "1h"
    assert page.locator("#telemetry-title").inner_text() == "Telemetry (last 1 h)"
    assert page.locator("#chart-events").get_attribute("data-markers") == "2"
    assert page.locator('#nic-charts [data-group="bytes"] .scatterlayer .trace').count() == 8
    offered = page.locator("[data-time-range] a[data-range]")
    assert [offered.nth(i).get_attribute("data-range") for i in range(offered.count())] == [
        "1h",
        "6h",
        "24h",
        "7d",
    ]
    assert axe_serious(page) == []
    assert refused == [] and errors == []


def test_a_node_without_telemetry_says_so(page, server):
    node = make_node(make_cluster(), "quiet-node", gpus=2, nics=1)
    provider = make_user(Role.PROVIDER_ADMIN)
    usable_password(provider, PASSWORD)
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    log_in(page, server.url, provider.username, PASSWORD)
    page.goto(f"{server.url}/nodes/{node.pk}/?range=24h")
    page.locator("#chart-events .main-svg").first.wait_for()
    assert page.locator("#telemetry-empty").is_visible() and page.locator("#nic-empty").is_visible()
    assert page.locator("#gpu-charts, #memory-figure, #nic-charts").count() == 0
    assert page.locator("#chart-events").get_attribute("data-markers") == "0"
    assert axe_serious(page) == []
    assert errors == []
