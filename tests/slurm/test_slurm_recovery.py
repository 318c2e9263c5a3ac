"""A node dies under a real PyTorch job on a real Slurm; Lockstep requeues it on the spare (no fakes).

The control plane runs as a real server (uvicorn) that the job registers with and reports to; beat's steps run in
the test's loop (tests/support/slurm_scenario.py)."""

import json

import pytest
from django.test import Client
from rest_framework.test import APIClient

from fleet.choices import NodeState
from fleet.models import Node
from jobs.choices import ActionKind, EscalationStage, FaultSource, IncidentState, JobState
from jobs.launchers import launcher_credential_create
from jobs.models import FaultEvent, Incident, NodeEscalation, RecoveryAction
from jobs.services.advance import recovery_advance
from jobs.services.faults import fault_ingest
from tests.support.factories import make_user, token_header
from tests.support.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def live(tmp_path):
    from tests.support.browser import SERVER_ENV
    from tests.support.processes import uvicorn_server

    with uvicorn_server(tmp_path, **SERVER_ENV) as running:
        yield running


def test_slurm_node_death_requeues_the_training_job_on_the_spare_from_its_checkpoint(
    slurm, slurm_cluster, live, tmp_path
):
    pytest.importorskip("torch", reason="the training job needs torch (CPU wheel)")
    from tests.support.slurm_scenario import booked_work_bounds, with_lockstep

    _, token = launcher_credential_create(actor=None, cluster=slurm_cluster, name="train")
    # The node dies 10 steps or more past a checkpoint, 40 apart: the job's reports lag its training (a loaded
    # server answers them in seconds), and the node must die before the next checkpoint is on disk; a lag of up to
    # 30 steps leaves that room.
    run = with_lockstep(
        slurm,
        slurm_cluster,
        tmp_path / "run",
        launcher_token=token,
        url=live.url,
        checkpoint_every=40,
        kill_after=10,
    )
    job, action, fault = run["job"], run["action"], run["fault"]

    # The ranks said where they ran: before on n1 and n2, after the requeue on n1 and the spare n3, never n2.
    assert sorted(r["node"] for r in run["before"]) == ["n1", "n2"]
    assert sorted(r["node"] for r in run["after"]) == ["n1", "n3"]
    assert run["slurm_job"]["restart_cnt"] >= 1 and "n2" not in run["slurm_job"]["nodes"]

    # One incident: Slurm's report of the dead node, joined by the agent's Xid 79 on it.
    assert FaultSource.SLURM in fault.sources and fault.kind == "node_unreachable"
    xid, created = fault_ingest(source="agent", kind="gpu_xid", xid=79, gpu_index=0, node=fault.node)
    assert xid.incident_id == fault.incident_id
    assert Incident.objects.filter(node=fault.node, state=IncidentState.OPEN).count() == 1

    # The node is drained with Lockstep's reason naming the incident.
    n2 = next(n for n in json.loads(slurm.run("sinfo", "--json").stdout)["nodes"] if n["name"] == "n2")
    assert "DRAIN" in n2["state_flags"], n2
    assert n2["reason"].startswith("lockstep: ") and f"incident {fault.incident_id}" in n2["reason"], n2[
        "reason"
    ]

    # The restart resumed from the job's own checkpoint, and the ledger books the iterations it really lost.
    assert action.kind == ActionKind.RESTART_FROM_CHECKPOINT and action.state == "succeeded"
    assert action.restore_iteration == run["checkpoint_at_fault"] > 0
    out = (tmp_path / "run" / f"job-{run['slurm_job_id']}.out").read_text()
    assert f"resumed from ckpt-{action.restore_iteration}.pt at step {action.restore_iteration}" in out
    lost = run["iteration_at_fault"] - action.restore_iteration
    assert lost > 0
    # Booked from the job's reports: between what its reports allowed at its fastest and at its slowest step.
    low, high = booked_work_bounds(job, action)
    assert low - 1e-6 <= action.work_lost_seconds <= high + 1e-6, (action.work_lost_seconds, low, high, lost)
    assert action.gpu_hours_lost > 0 and action.gpu_hours_saved == pytest.approx(0, abs=1e-6)
    assert job.state == JobState.RUNNING and run["first_progress"].iteration > action.restore_iteration
    assert sorted(
        job.allocations.filter(released_at__isnull=True).values_list("node__hostname", flat=True)
    ) == ["n1", "n3"]
    # The job page shows the work redone since the checkpoint, from the job's own reports.
    browser = Client()
    browser.force_login(make_user("operator"))
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert (
        f'{action.work_lost_seconds:,.1f} s from iteration <span class="restore-iteration">{action.restore_iteration:,}</span>'
        in page
    )
    assert RecoveryAction.objects.filter(job=job, kind=ActionKind.RESTART_FROM_CHECKPOINT).count() >= 1
    assert FaultEvent.objects.filter(node=fault.node).count() >= 2
    assert all(value >= 0 for value in run["seconds"].values()), run["seconds"]
    slurm.run("scancel", run["slurm_job_id"])
    # The node waits for a human; once repaired its health check runs on it through Slurm — and a failing one
    # keeps it out of service (Lockstep's and Slurm's view alike).

    def stage():
        recovery_advance(cluster_ids=[slurm_cluster.pk])
        return NodeEscalation.objects.get(node=fault.node).stage

    assert wait_for(lambda: stage() == EscalationStage.FAILED, 30, what="the ladder to wait for a repair")
    slurm.start_node("n2")
    slurm_cluster.refresh_from_db()
    slurm_cluster.connection = {
        **slurm_cluster.connection,
        "health_check_command": 'test "$SLURMD_NODENAME" != n2',
    }
    slurm_cluster.save(update_fields=["connection"])
    operator = APIClient()
    operator.credentials(**token_header(make_user("operator")))
    repaired = operator.post(f"/api/v1/faults/{fault.pk}/repaired/", {"reason": "reseated"}, format="json")
    assert repaired.status_code == 200, repaired.content
    wait_for(
        lambda: stage() and NodeEscalation.objects.get(node=fault.node).check_handle.startswith("check:"),
        30,
        what="the health check job to start",
    )
    wait_for(lambda: stage() == EscalationStage.FAILED, 60, what="the failing check to send the node back")
    escalation = NodeEscalation.objects.get(node=fault.node)
    assert escalation.needs_human and Node.objects.get(pk=fault.node.pk).state == NodeState.FAILED
    n2 = next(n for n in json.loads(slurm.run("sinfo", "--json").stdout)["nodes"] if n["name"] == "n2")
    assert "DRAIN" in n2["state_flags"] and n2["reason"].startswith("lockstep: health check job"), n2
