"""Charts and heat maps carry text alternatives: a visually hidden summary beside each, which the chart's
container names with aria-describedby."""

import re

import pytest

from fleet.choices import GPUHealth, NodeState
from jobs.services.faults import fault_ingest
from tests.support.factories import make_cluster, make_node

pytestmark = pytest.mark.django_db


def described(page: str, element_id: str) -> str:
    """The text of the element that ``element_id``'s aria-describedby names."""
    tag = re.search(rf'<[^>]*\bid="{element_id}"[^>]*>', page)[0]
    target = re.search(r'aria-describedby="([^"]+)"', tag)[1]
    return re.search(rf'<p class="visually-hidden" id="{target}">(.*?)</p>', page, re.S)[1]


def test_each_heat_map_and_chart_of_the_fleet_page_is_described_in_words(client, users):
    cluster = make_cluster(name="words-1")
    nodes = [make_node(cluster, f"w{i}") for i in range(4)]
    sick = nodes[1].gpus.get(index=2)
    sick.health = GPUHealth.FAILED
    sick.save()
    nodes[2].state = NodeState.CORDONED
    nodes[2].save()
    nodes[3].state = NodeState.FAILED
    nodes[3].save()
    fault_ingest(source="api", kind="nic_down", node=nodes[0], nic_name="mlx5_0")
    client.force_login(users["operator"])
    page = client.get("/").content.decode()
    assert described(page, f"heatmap-{cluster.pk}") == (
        "1 of 4 nodes have all GPUs healthy; 1 not all GPUs healthy: w1 (1 GPU); 1 out of service: w2; 1 failed: w3."
    )
    assert re.match(
        r"1 fault in 1 interval from .* UTC to .* UTC; the most, 1, at .* UTC\.",
        described(page, "chart-faults"),
    )
    assert described(page, "chart-saved") == "No GPU-hours in this range."


def test_the_job_page_describes_its_timeline_and_iterations(client, users, tenant_a):
    from jobs.services.jobs import job_submit

    cluster = make_cluster(name="words-2", dedicated_tenant=tenant_a)
    make_node(cluster, "v0")
    job, _ = job_submit(
        actor=users["tenant-admin"], tenant=tenant_a, cluster=cluster, name="described", gpus=8
    )
    client.force_login(users["tenant-admin"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "0 faults, 0 recovery actions; 0 snapshots." in described(page, "job-timeline")
    assert "restarting from the last checkpoint" in described(page, "job-iterations")
