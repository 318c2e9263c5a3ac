"""The job page's checkpoint advice (Young/Daly, from the what-if's fault model)."""

import pytest

from jobs.services.jobs import job_submit
from simulator.checkpointing import daly_interval, job_checkpoint_advice
from simulator.profiles import PROFILES
from tests.support.factories import make_cluster, make_node

pytestmark = pytest.mark.django_db


def test_advice_follows_the_job_size_and_protection():
    small = job_checkpoint_advice(
        gpus=512, protected=False, restart_overhead_minutes=10, current_interval_seconds=1800
    )
    large = job_checkpoint_advice(
        gpus=16_384, protected=True, restart_overhead_minutes=10, current_interval_seconds=1800
    )
    mtbf = PROFILES["llama3"].mean_hours_between(512) * 3600
    assert small["this_job"] is small["unprotected"]
    assert small["unprotected"]["daly_minutes"] == pytest.approx(
        daly_interval(write_seconds=30, mtbf_seconds=mtbf) / 60, abs=0.01
    )
    # a bigger job fails more often and should checkpoint more often; with Lockstep far less often than without
    assert large["unprotected"]["daly_minutes"] < small["unprotected"]["daly_minutes"]
    assert (
        large["this_job"] is large["with_lockstep"]
        and large["with_lockstep"]["daly_minutes"] > 2 * large["unprotected"]["daly_minutes"]
    )
    assert (
        large["with_lockstep"]["effective_training_time_at_daly"]
        > large["unprotected"]["effective_training_time_at_daly"]
    )


def test_job_page_shows_its_checkpoint_advice(client, users, tenant_a):
    cluster = make_cluster(driver="kubernetes")
    for i in range(4):
        make_node(cluster, f"h{i}")
    job, _ = job_submit(
        actor=users["operator"],
        tenant=tenant_a,
        cluster=cluster,
        name="big",
        gpus=32,
        hostnames=["h0", "h1", "h2", "h3"],
    )
    client.force_login(users["tenant-viewer"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    expected = job_checkpoint_advice(
        gpus=32,
        protected=False,
        restart_overhead_minutes=cluster.restart_overhead_minutes,
        current_interval_seconds=job.checkpoint_interval * job.seconds_per_iteration,
    )
    assert 'id="checkpoint-advice"' in page and "(Young/Daly" in page
    assert f'data-daly-minutes="{expected["unprotected"]["daly_minutes"]}"' in page
