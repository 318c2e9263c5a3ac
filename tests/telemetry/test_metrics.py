import pytest

from jobs.services.faults import fault_ingest
from tests.support.factories import make_cluster, make_node

pytestmark = pytest.mark.django_db


def test_metrics_expose_lockstep_figures_with_prometheus_names(api, users):
    node = make_node(make_cluster())
    fault_ingest(source="api", kind="nic_down", node=node, nic_name="mlx5_1")
    api.as_token(users["operator"], "read")
    response = api.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert 'lockstep_gpus{health="healthy"} 8.0' in text
    assert 'lockstep_faults_total{kind="nic_down"} 1.0' in text
    assert "# TYPE lockstep_fault_to_decision_seconds histogram" in text
    assert 'lockstep_fault_to_decision_seconds_bucket{le="+Inf"}' in text
    assert "lockstep_gpu_seconds_saved_total" in text
    assert "# TYPE lockstep_rollouts gauge" in text


@pytest.mark.parametrize(
    "role, status", [("tenant-admin", 403), ("tenant-viewer", 403), ("provider-admin", 200)]
)
def test_metrics_are_fleet_wide_figures_for_providers(api, users, role, status):
    api.as_token(users[role], "read")
    assert api.get("/metrics").status_code == status


def test_metrics_need_credentials(api, db):
    assert api.get("/metrics").status_code == 401


def test_grafana_dashboard_reads_only_metrics_lockstep_exposes(api, users):
    import json
    import re
    from pathlib import Path

    from django.conf import settings

    dashboard = json.loads((Path(settings.BASE_DIR) / "docs" / "grafana-lockstep.json").read_text())
    api.as_token(users["operator"], "read")
    exposed = {
        line.split(" ")[2]
        for line in api.get("/metrics").content.decode().splitlines()
        if line.startswith("# TYPE")
    }
    series = set()
    for name in exposed:
        series |= {name, f"{name}_total", f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"lockstep_[a-z_]+", target["expr"]))
    assert used and used <= series, used - series
    titles = [p["title"] for p in dashboard["panels"]]
    assert any("Failover timeline" in t for t in titles) and any("GPU-hours saved" in t for t in titles)
