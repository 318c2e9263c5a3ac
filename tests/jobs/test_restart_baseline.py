"""Issue 49, item 4: the restart baseline is measured, not assumed. A restart Lockstep carries out for a job that
reports its own progress ends its pause at the job's first training step after it (not when the scheduler runs it),
and that fault → first step adds to the cluster's restart measurements for jobs of that size; until
RESTART_BASELINE_MIN_SAMPLES are in, the baseline is the cluster's setting, marked assumed, on the job page, the API
and the ledger, with what was expected kept apart from what happened."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from jobs.choices import ActionKind, ActionState
from jobs.ledger import actual_gpu_hours, baseline_gpu_hours
from jobs.models import RecoveryAction, RecoveryEstimate
from jobs.services.advance import recovery_advance
from jobs.services.estimates import estimates_record, restart_baseline_of, restart_kind
from jobs.services.faults import fault_handle, fault_ingest
from tests.support.factories import make_user
from tests.support.jobs import node_of
from tests.support.runtime_jobs import real_job, runtime_cluster

pytestmark = pytest.mark.django_db


def _restart(job) -> RecoveryAction:
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=node_of(job))
    [action_id] = fault_handle(fault_id=fault.pk)
    action = RecoveryAction.objects.get(pk=action_id)
    assert action.kind == ActionKind.RESTART_FROM_CHECKPOINT, action.reason
    return action


def _step(api, job, iteration):
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {job.token}")
    answer = api.post(
        f"/api/v1/jobs/{job.pk}/progress/", {"iteration": iteration, "step_seconds": 0.5}, format="json"
    )
    assert answer.status_code == 200, answer.content


def test_restart_kinds_group_jobs_within_a_factor_of_two():
    assert [restart_kind(g) for g in (1, 2, 3, 8, 15, 16)] == [
        "restart_g1",
        "restart_g2",
        "restart_g2",
        "restart_g8",
        "restart_g8",
        "restart_g16",
    ]


def test_an_assumed_baseline_says_so_and_a_restart_pause_ends_at_the_first_step(tenant_a, api, users):
    cluster = runtime_cluster(policy_on=False, nodes=4)
    job = real_job(cluster, tenant_a, api, iteration=500, checkpoint=400)
    action = _restart(job)
    assumed = action.estimate["restart_overhead"]
    assert assumed["basis"] == "assumed" and assumed["seconds"] == 600.0
    assert assumed["samples"] == 0 and assumed["needed"] == settings.RESTART_BASELINE_MIN_SAMPLES
    assert "assumed: 600 s, the cluster's restart overhead setting (0 of 3" in assumed["detail"]
    assert action.gpu_hours_baseline == pytest.approx(
        baseline_gpu_hours(
            gpus=16, seconds_since_checkpoint=100 * job.seconds_per_iteration, restart_overhead_seconds=600
        )
    )
    assert action.estimate["expected"]["pause_seconds"] == 600.0
    # Slurm (here the instant driver) runs it again: the pause so far is booked, and stays provisional.
    RecoveryAction.objects.filter(pk=action.pk).update(detected_at=timezone.now() - timedelta(seconds=20))
    assert recovery_advance()["completed"] == 1
    action.refresh_from_db()
    assert action.state == ActionState.SUCCEEDED and action.resumed_at is None
    scheduled = action.pause_seconds
    assert 19 < scheduled < 25
    # The job's own first step after the restart ends the pause, and measures the restart.
    _step(api, job, 401)
    action.refresh_from_db()
    assert action.resumed_at is not None and action.resumed_at >= action.ended_at
    pause = (action.resumed_at - action.detected_at).total_seconds()
    assert action.pause_seconds == pytest.approx(pause) and pause >= scheduled
    assert action.gpu_hours_lost == pytest.approx(
        actual_gpu_hours(gpus=16, pause_seconds=pause, work_lost_seconds=action.work_lost_seconds)
    )
    assert action.gpu_hours_saved == pytest.approx(0.0)  # a restart is the baseline itself
    assert "Measured: the job trained again (iteration 401)" in action.reason
    measured = RecoveryEstimate.objects.get(cluster=cluster, kind="restart_g16")
    assert measured.samples == 1 and measured.seconds == pytest.approx(pause)
    # A later step does not book it again.
    _step(api, job, 402)
    assert RecoveryEstimate.objects.get(cluster=cluster, kind="restart_g16").samples == 1
    # The API and the job page say the baseline is assumed, with its value; expected and realized apart.
    api.as_token(users["operator"])
    body = api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["restart_baseline"]["basis"] == "assumed" and body["restart_baseline"]["samples"] == 1
    shown = api.get(f"/api/v1/actions/{action.pk}/").json()
    assert shown["restart_baseline"]["basis"] == "assumed"
    assert shown["expected"]["pause_seconds"] == 600.0 and shown["pause_seconds"] == pytest.approx(pause)
    ledger = api.get(f"/api/v1/incidents/{action.incident_id}/").json()["ledger"]
    assert [b["basis"] for b in ledger["restart_baselines"]] == ["assumed"]
    browser = Client()
    browser.force_login(make_user("operator"))
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="restart-baseline" data-basis="assumed"' in page and "1 of 3 restarts measured" in page
    assert "(expected 600.0)" in page and 'data-step="training again"' in page
    incident = browser.get(f"/incidents/{action.incident_id}/").content.decode()
    assert 'data-basis="assumed"' in incident


def test_measured_restarts_replace_the_assumed_baseline_for_jobs_of_that_size(tenant_a, api, users):
    cluster = runtime_cluster(policy_on=False, nodes=6)
    estimates_record([(cluster.pk, "restart_g16", 30.0)] * (settings.RESTART_BASELINE_MIN_SAMPLES - 1))
    job = real_job(cluster, tenant_a, api, iteration=500, checkpoint=400)
    first = _restart(job)
    assert first.estimate["restart_overhead"]["basis"] == "assumed"  # two of three measured
    assert recovery_advance()["completed"] == 1
    _step(api, job, 401)
    first.refresh_from_db()
    measured = RecoveryEstimate.objects.get(cluster=cluster, kind="restart_g16")
    assert measured.samples == settings.RESTART_BASELINE_MIN_SAMPLES
    # The next fault of a job of that size is priced with what the restarts measured.
    _step(api, job, 600)
    job.refresh_from_db()
    second = _restart(job)
    used = second.estimate["restart_overhead"]
    assert used["basis"] == "measured" and used["seconds"] == pytest.approx(measured.seconds, abs=1e-3)
    assert "average of 3 restarts on this cluster (jobs of 16–31 GPUs)" in used["detail"]
    assert second.gpu_hours_baseline == pytest.approx(
        baseline_gpu_hours(
            gpus=16,
            seconds_since_checkpoint=(600 - job.checkpoint_iteration_now()) * job.seconds_per_iteration,
            restart_overhead_seconds=measured.seconds,
        ),
        rel=1e-3,
    )
    api.as_token(users["operator"])
    assert api.get(f"/api/v1/jobs/{job.pk}/").json()["restart_baseline"]["basis"] == "measured"
    # A job of another size on the same cluster is still priced with the assumed overhead.
    job.gpus = 4
    other = restart_baseline_of(job)
    assert other.basis == "assumed" and other.seconds == 600.0 and other.samples == 0
