"""Fixtures shared by the telemetry tests."""

import pytest
from django.utils import timezone

from jobs.services.jobs import job_progress, job_submit
from telemetry.models import GPUState, NICState
from tests.support.factories import make_cluster, make_node


@pytest.fixture
def job(tenant_a, users):
    """A 32-GPU job of tenant A on four of eight Kubernetes nodes over two leaf switches, its links and GPUs
    healthy, its last step 2.9 s after 2.0 s."""
    cluster = make_cluster(driver="kubernetes")
    nodes = [make_node(cluster, f"h{i}", leaf="leaf-0" if i < 4 else "leaf-1") for i in range(8)]
    now = timezone.now()
    for node in nodes:
        for nic in node.nics.all():
            NICState.objects.create(
                nic=nic,
                node=node,
                ts=now,
                link_state="up",
                symbol_rate=5.0,
                rcv_error_rate=1.0,
                congestion_rate=2_000.0,
            )
        for gpu in node.gpus.all():
            GPUState.objects.create(gpu=gpu, node=node, ts=now, temperature=62.0, utilization=96.0)
    job, _ = job_submit(
        actor=users["operator"],
        tenant=tenant_a,
        cluster=cluster,
        name="allreduce",
        gpus=32,
        hostnames=["h0", "h1", "h4", "h5"],
    )
    job_progress(job=job, iteration=100, step_seconds=2.0)
    job_progress(job=job, iteration=150, step_seconds=2.9)
    return job
