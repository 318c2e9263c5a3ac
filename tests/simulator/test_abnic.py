"""Scenario ab-nic: the same rail NIC fails under a protected and an unprotected job."""

from datetime import timedelta

import pytest

from jobs.models import FaultEvent, Job, RecoveryAction
from jobs.services.faults import fault_handle
from simulator.models import Scenario
from simulator.services.scenarios import abnic_start, scenarios_advance
from simulator.world import SERVICE_USER, world_build

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator():
    from django.contrib.auth import get_user_model

    world_build(seed=3, nodes_per_cluster=24, spares=4)
    return get_user_model().objects.get(username=SERVICE_USER)


def test_protected_job_fails_over_the_unprotected_one_restarts(operator):
    scenario = abnic_start(actor=operator, gpus=32, strike_after_seconds=60)
    assert scenarios_advance() == 0  # armed, not yet due
    assert scenarios_advance(now=scenario.strike_at + timedelta(seconds=1)) == 1
    assert scenarios_advance(now=scenario.strike_at + timedelta(seconds=2)) == 0  # fires once
    faults = list(FaultEvent.objects.filter(details__scenario=scenario.pk))
    assert len(faults) == 2 and {f.nic_name for f in faults} == {"mlx5_3"}
    for fault in faults:
        fault_handle(fault_id=fault.pk)
    protected = Job.objects.get(pk=scenario.jobs["protected"])
    unprotected = Job.objects.get(pk=scenario.jobs["unprotected"])
    assert list(RecoveryAction.objects.filter(job=protected).values_list("kind", flat=True)) == [
        "nic_failover"
    ]
    assert list(RecoveryAction.objects.filter(job=unprotected).values_list("kind", flat=True)) == [
        "restart_from_checkpoint"
    ]
    page_data = Scenario.objects.get(pk=scenario.pk)
    assert page_data.state == "fired"


def test_scenario_page_shows_both_jobs(client, operator, users):
    scenario = abnic_start(actor=operator, gpus=16)
    client.force_login(users["operator"])
    page = client.get(f"/scenarios/{scenario.pk}/").content.decode()
    assert "ab-nic-protected" in page and "ab-nic-unprotected" in page and 'id="abnic-chart"' in page
    client.force_login(users["tenant-admin"])
    assert client.get(f"/scenarios/{scenario.pk}/").status_code == 403


def test_jobs_that_report_their_progress_keep_their_protection_and_only_the_unprotected_restarts(operator):
    """The simulator's jobs report their own progress (as the demo's do). Reports change where a job's figures come
    from, not its kind: the protected job still fails over, only the unprotected one restarts."""
    from jobs.protection import job_protection
    from jobs.services.jobs import job_progress

    scenario = abnic_start(actor=operator, gpus=32, strike_after_seconds=60)
    protected = Job.objects.get(pk=scenario.jobs["protected"])
    unprotected = Job.objects.get(pk=scenario.jobs["unprotected"])
    for job in (protected, unprotected):
        for iteration, checkpoint in ((300, True), (350, False)):
            job_progress(job=job, iteration=iteration, step_seconds=2.0, checkpoint=checkpoint)
        job.refresh_from_db()
        assert job.simulated and job.reports_progress and job.iteration_now() == 350
    assert job_protection(protected).protected and not job_protection(unprotected).protected
    scenarios_advance(now=scenario.strike_at + timedelta(seconds=1))
    for fault in FaultEvent.objects.filter(details__scenario=scenario.pk):
        fault_handle(fault_id=fault.pk)
    kinds = {
        label: list(RecoveryAction.objects.filter(job=job).values_list("kind", flat=True))
        for label, job in (("protected", protected), ("unprotected", unprotected))
    }
    assert kinds == {"protected": ["nic_failover"], "unprotected": ["restart_from_checkpoint"]}
    unprotected.refresh_from_db()
    assert unprotected.state in ("Recovering", "Running")
