"""Protection on a real Slurm: the real PyTorch job under the protection runtime, a node killed under it (its
slurmd, its rank and its snapshot holder), Lockstep restores it from memory on the spare (no fakes).

The control — the same job unprotected, restarted from its disk checkpoint — is tests/slurm/test_slurm_recovery.py.
"""

import json

import pytest
from rest_framework.test import APIClient

from jobs.choices import ActionKind, FaultSource, IncidentState, JobState, SnapshotKind
from jobs.launchers import launcher_credential_create
from jobs.models import Incident, JobSnapshot, RecoveryAction
from jobs.protection import job_protection
from tests.support.factories import make_user, token_header

pytestmark = pytest.mark.django_db(transaction=True)

SNAPSHOT_EVERY = 5
CHECKPOINT_EVERY = 40
# The A/B's nodes die at least this many steps past the unprotected job's checkpoint (more than a snapshot
# interval, so the arms differ) and before its next one: the reports it is judged by lag its training by up to
# CHECKPOINT_EVERY - KILL_AFTER steps on a loaded machine before no moment fits.
KILL_AFTER = 10


@pytest.fixture
def live(tmp_path):
    from tests.support.browser import SERVER_ENV
    from tests.support.processes import uvicorn_server

    with uvicorn_server(tmp_path, **SERVER_ENV) as running:
        yield running


def test_a_protected_job_loses_a_node_and_is_restored_from_its_peers_memory_on_the_spare(
    slurm_holders, protected_slurm_cluster, live, tmp_path
):
    pytest.importorskip("torch", reason="the training job needs torch (CPU wheel)")
    from tests.support.slurm_scenario import booked_work_bounds, with_lockstep

    slurm, cluster = slurm_holders, protected_slurm_cluster
    _, token = launcher_credential_create(actor=None, cluster=cluster, name="train")
    run = with_lockstep(
        slurm,
        cluster,
        tmp_path / "run",
        launcher_token=token,
        url=live.url,
        checkpoint_every=CHECKPOINT_EVERY,
        snapshot_every=SNAPSHOT_EVERY,
        kill_after=CHECKPOINT_EVERY // 2 + 3,
    )
    job, action, fault = run["job"], run["action"], run["fault"]

    # Before and after: n1 + n2, then n1 + the spare n3; one incident, the node drained with Lockstep's reason.
    assert sorted(r["node"] for r in run["before"]) == ["n1", "n2"]
    assert sorted(r["node"] for r in run["after"]) == ["n1", "n3"]
    assert FaultSource.SLURM in fault.sources and fault.kind == "node_unreachable"
    assert Incident.objects.filter(node=fault.node, state=IncidentState.OPEN).count() == 1
    n2 = next(n for n in json.loads(slurm.run("sinfo", "--json").stdout)["nodes"] if n["name"] == "n2")
    assert "DRAIN" in n2["state_flags"] and f"lockstep: incident {fault.incident_id}" in n2["reason"], n2

    # Lockstep chose the restore because the job was protected (policy + runtime reports), and the runtime restored
    # from memory: rank 1 (n2's) from its replica on n1, not from the disk checkpoint.
    assert action.kind == ActionKind.RESTORE_FROM_SNAPSHOT and action.state == "succeeded", action.reason
    assert RecoveryAction.objects.filter(job=job, kind=ActionKind.RESTART_FROM_CHECKPOINT).count() == 0
    assert run["resumed"]["from"] == "memory", run["resumed"]
    restore = run["restore"]
    assert restore.kind == SnapshotKind.RESTORE
    assert any(place["rank"] == 1 and "replica on n1" in place["source"] for place in restore.locations), (
        restore.locations
    )
    out = (tmp_path / "run" / f"job-{run['slurm_job_id']}.out").read_text()
    assert f"restored from memory at step {restore.iteration}" in out
    assert restore.iteration > run["checkpoint_seen_before_kill"]

    # Lost at most one snapshot interval, from the job's own reports (its last report before the fault may lag the
    # step it really reached, which the restore point can then be past: nothing lost); the ledger books what was
    # measured.
    lost = max(0, run["iteration_at_fault"] - restore.iteration)
    assert lost <= SNAPSHOT_EVERY, (run["iteration_at_fault"], restore.iteration)
    assert action.restore_iteration == restore.iteration
    low, high = booked_work_bounds(job, action)  # at a step time the job reported (a moving average of them)
    assert low - 1e-6 <= action.work_lost_seconds <= high + 1e-6, (action.work_lost_seconds, low, high, lost)
    assert action.pause_seconds == pytest.approx(
        (restore.ended_at - action.detected_at).total_seconds(), abs=1e-3
    )
    assert action.gpu_hours_saved > 0 and "Measured: the runtime restored" in action.reason
    # And what the job's snapshots cost it while it trained, as its runtime measured it in the training thread:
    # some, and less than the time it trained before the fault.
    reported = JobSnapshot.objects.filter(
        job=job, kind=SnapshotKind.SNAPSHOT, ended_at__lte=action.detected_at
    )
    assert reported.filter(overhead_seconds__gt=0).exists()
    assert action.snapshot_overhead_seconds == pytest.approx(
        sum(s.overhead_seconds or 0 for s in reported), rel=1e-6, abs=1e-6
    )
    trained = (action.detected_at - job.created_at).total_seconds()
    assert 0 < action.snapshot_overhead_seconds < trained, (action.snapshot_overhead_seconds, trained)
    assert run["first_progress"].iteration > restore.iteration
    job.refresh_from_db()
    assert job.state == JobState.RUNNING

    # The API and the page say protected, and why.
    verdict = job_protection(job)
    assert verdict.protected, verdict.reason
    api = APIClient()
    api.credentials(**token_header(make_user("operator")))
    body = api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["protected"] is True and "protection runtime reports" in body["protection_reason"], body
    assert JobSnapshot.objects.filter(job=job, kind=SnapshotKind.SNAPSHOT).exists()
    slurm.run("scancel", run["slurm_job_id"])


def test_a_predicted_failure_moves_the_protected_job_off_the_node_in_time_with_nothing_lost(
    slurm_holders, protected_slurm_cluster, live, tmp_path
):
    pytest.importorskip("torch", reason="the training job needs torch (CPU wheel)")
    from tests.support.slurm_scenario import predicted_move

    slurm, cluster = slurm_holders, protected_slurm_cluster
    _, token = launcher_credential_create(actor=None, cluster=cluster, name="train")
    run = predicted_move(
        slurm,
        cluster,
        tmp_path / "run",
        launcher_token=token,
        url=live.url,
        checkpoint_every=CHECKPOINT_EVERY,
        snapshot_every=SNAPSHOT_EVERY,
    )
    job, action, restore = run["job"], run["action"], run["restore"]

    # Asked to write through, the job did, and was moved off n2 onto the spare before n2 failed.
    assert action.kind == ActionKind.PROACTIVE_MIGRATION and action.state == "succeeded", action.reason
    assert action.fault_id == run["prediction"].pk and "wrote its snapshot through" in action.reason
    assert run["write_through"] is not None and run["write_through"].iteration == restore.iteration
    assert sorted(r["node"] for r in run["before"]) == ["n1", "n2"]
    assert sorted(r["node"] for r in run["after"]) == ["n1", "n3"]
    assert run["killed_at"] > restore.ended_at.timestamp()
    out = (tmp_path / "run" / f"job-{run['slurm_job_id']}.out").read_text()
    # (Slurm starts the output anew on the requeue: the relaunch's own lines.)
    assert f"rank 1 restored from memory at step {restore.iteration}" in out

    # Nothing lost: restored (from memory) the very step it had reached.
    assert restore.kind == SnapshotKind.RESTORE and run["resumed"]["from"] == "memory"
    assert run["reached"] == restore.iteration
    assert run["first_progress"].iteration > restore.iteration

    # The ledger: the measured cost of the move (its pause, no work lost) against the expected saving, realized
    # once the node failed within the prediction's horizon.
    assert action.restore_iteration == restore.iteration and action.work_lost_seconds == 0
    assert action.pause_seconds == pytest.approx(
        (restore.ended_at - action.started_at).total_seconds(), abs=1e-3
    )
    assert action.saving == "realized", action.saving
    assert action.gpu_hours_saved == pytest.approx(action.gpu_hours_baseline - action.gpu_hours_lost)
    assert action.gpu_hours_saved > 0
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert sorted(
        job.allocations.filter(released_at__isnull=True).values_list("node__hostname", flat=True)
    ) == [
        "n1",
        "n3",
    ]
    slurm.run("scancel", run["slurm_job_id"])


def test_the_ab_two_real_jobs_one_protected_lose_a_node_each(ab_slurm, ab_cluster, live, tmp_path):
    """``simulate ab-nic``'s story with real jobs (issue 49): the protected one, with a standby in its allocation,
    keeps running — its survivor keeps its process and a standby takes the lost rank, at most a step redone —
    while the unprotected one is requeued and loses everything since its checkpoint, as their own reports say."""
    pytest.importorskip("torch", reason="the training job needs torch (CPU wheel)")
    from tests.support.slurm_scenario import ab_run

    _, token = launcher_credential_create(actor=None, cluster=ab_cluster, name="train")
    run = ab_run(
        ab_slurm,
        ab_cluster,
        tmp_path / "ab",
        launcher_token=token,
        url=live.url,
        checkpoint_every=CHECKPOINT_EVERY,
        snapshot_every=SNAPSHOT_EVERY,
        kill_after=KILL_AFTER,
        standbys=1,
    )
    protected, unprotected = run["protected"], run["unprotected"]
    assert run["victims"]["protected"] != run["victims"]["unprotected"]
    assert protected["action"].kind == ActionKind.RANK_REPLACEMENT, protected["action"].reason
    before, after = protected["survivor_pids"]
    assert before == after and protected["lost_iterations"] <= 1  # not restarted: the same process
    assert unprotected["action"].kind == ActionKind.RESTART_FROM_CHECKPOINT
    assert unprotected["resumed"]["from"] == "disk" and unprotected["restored"] % CHECKPOINT_EVERY == 0
    # It redoes everything since the checkpoint it had on disk when its node died, which its reports showed at
    # least ``kill_after`` steps behind it (ab_run checks the disk, not only the reports that lag it).
    assert unprotected["restored"] == run["checkpoint_at_kill"], (
        unprotected["restored"],
        run["checkpoint_at_kill"],
    )
    assert unprotected["lost_iterations"] == unprotected["reached"] - unprotected["restored"]
    assert unprotected["lost_iterations"] >= run["kill_after"] > SNAPSHOT_EVERY
    assert protected["action"].gpu_hours_saved > 0 and unprotected["action"].gpu_hours_saved == pytest.approx(
        0, abs=1e-6
    )
    # The ledger books the steps the runtime redid, and the restart the unprotected one took.
    assert (
        f"from iteration {protected['restored']} ({protected['lost_iterations']} step(s) redone)"
        in protected["action"].reason
    ), protected["action"].reason
    assert unprotected["action"].restore_iteration == unprotected["restored"]
    assert unprotected["action"].work_lost_seconds > protected["action"].work_lost_seconds
    # Training again in seconds without a requeue, against the unprotected job's requeue and relaunch.
    assert 0 < protected["resume_seconds"] < unprotected["resume_seconds"], (
        protected["resume_seconds"],
        unprotected["resume_seconds"],
    )
    for name, arm in (("protected", protected), ("unprotected", unprotected)):
        assert run["victims"][name] not in {r["node"] for r in arm["after"]}
    ab_slurm.run("scancel", protected["job"].slurm.slurm_job_id, unprotected["job"].slurm.slurm_job_id)
