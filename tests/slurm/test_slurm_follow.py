"""Lockstep follows what Slurm does with a job on its own: a requeue Lockstep did not make, and a restart Slurm
placed on another node than the spare Lockstep booked (real Slurm, no fakes)."""

import json

from rest_framework.test import APIClient

from fleet.choices import NodeState
from fleet.models import Node
from jobs.choices import ActionKind, JobPhaseKind, JobState
from jobs.models import Job, JobPhase, RecoveryAction, SlurmJob
from jobs.services.advance import recovery_advance
from jobs.services.faults import fault_handle, fault_ingest
from jobs.services.slurm_jobs import slurm_sync
from tests.support.factories import make_user, token_header
from tests.support.slurm import sbatch, wait


def squeue(slurm, slurm_id: str) -> dict:
    return json.loads(slurm.run("squeue", "--json", "--all", "--jobs", slurm_id).stdout)["jobs"][0]


def hosts(job: Job) -> list[str]:
    return sorted(job.allocations.filter(released_at__isnull=True).values_list("node__hostname", flat=True))


def running_on(slurm, slurm_id: str, *, nudge: bool = False):
    found = squeue(slurm, slurm_id)
    if found["job_state"] == "RUNNING":
        return found
    if nudge and found["job_state"] == "PENDING" and found.get("state_reason") == "BeginTime":
        # Slurm holds a requeued job until the old run's credentials expire; an admin may let it start now.
        slurm.run("scontrol", "update", f"JobId={slurm_id}", "StartTime=now", check=False)
    return None


def test_slurm_requeue_by_slurm_itself_moves_the_job_through_recovering_onto_its_new_node(
    slurm, slurm_cluster
):
    slurm_id = sbatch(
        slurm,
        "-N",
        "1",
        "-x",
        "n2,n3",
        "--requeue",
        "-A",
        "acme",
        "-J",
        "own",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 300",
    )
    wait(lambda: running_on(slurm, slurm_id), what="the job to run on n1")
    assert slurm_sync(cluster=slurm_cluster)["adopted"] == [slurm_id]
    job = SlurmJob.objects.get(cluster=slurm_cluster, slurm_job_id=slurm_id).job
    assert job.state == JobState.RUNNING and hosts(job) == ["n1"]

    # Someone requeues it in Slurm, away from n1: not Lockstep's doing.
    slurm.run("scontrol", "requeuehold", slurm_id)
    slurm.run("scontrol", "update", f"JobId={slurm_id}", "ExcNodeList=n1,n3")
    slurm.run("scontrol", "release", slurm_id)
    assert slurm_sync(cluster=slurm_cluster)["followed"] == {slurm_id: "requeued"}
    job.refresh_from_db()
    assert job.state == JobState.RECOVERING and hosts(job) == []
    recovering = JobPhase.objects.get(job=job, kind=JobPhaseKind.RECOVERING, ended_at__isnull=True)
    assert recovering.reason == "Slurm requeued the job itself (restart 1)"
    assert slurm_sync(cluster=slurm_cluster)["followed"] == {}  # nothing new while it waits

    found = wait(lambda: running_on(slurm, slurm_id, nudge=True), 60, "Slurm to run the job again")
    assert found["nodes"] == "n2"
    assert slurm_sync(cluster=slurm_cluster)["followed"] == {slurm_id: "running"}
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and hosts(job) == ["n2"]
    phases = [
        (p.kind, p.ended_at is None) for p in JobPhase.objects.filter(job=job).order_by("started_at", "id")
    ]
    assert phases[-2:] == [(JobPhaseKind.RECOVERING, False), (JobPhaseKind.RUNNING, True)]
    # Lockstep did nothing: no recovery action, nothing booked; the requeue is audited as Slurm's.
    assert not RecoveryAction.objects.filter(job=job).exists()
    from controlplane.models import AuditEntry

    assert AuditEntry.objects.filter(action="job.requeued_by_slurm", object_id=str(job.pk)).count() == 1
    operator = APIClient()
    operator.credentials(**token_header(make_user("operator")))
    row = operator.get("/api/v1/slurm-jobs/", {"cluster": slurm_cluster.pk}).json()["results"][0]
    assert (row["job"], row["restart_count"], row["nodes"], row["slurm_state"]) == (
        job.pk,
        1,
        "n2",
        "RUNNING",
    )
    slurm.run("scancel", slurm_id)


def test_slurm_restart_runs_on_the_spare_lockstep_booked(slurm, slurm_cluster):
    # One node: Slurm places it on n1 (the spare n3 weighs more).
    slurm_id = sbatch(
        slurm, "-N", "1", "--requeue", "-A", "acme", "-J", "one", "-o", "/dev/null", "--wrap", "sleep 300"
    )
    wait(lambda: running_on(slurm, slurm_id), what="the job to run")
    slurm_sync(cluster=slurm_cluster)
    job = SlurmJob.objects.get(cluster=slurm_cluster, slurm_job_id=slurm_id).job
    assert hosts(job) == ["n1"]
    n1 = Node.objects.get(cluster=slurm_cluster, hostname="n1")
    fault, _ = fault_ingest(source="agent", kind="gpu_xid", xid=79, gpu_index=0, node=n1)
    fault_handle(fault_id=fault.pk)

    def restarted():
        slurm_sync(cluster=slurm_cluster)
        recovery_advance(cluster_ids=[slurm_cluster.pk])
        return RecoveryAction.objects.filter(
            job=job, kind=ActionKind.RESTART_FROM_CHECKPOINT, state="succeeded"
        ).first()

    wait(restarted, 90, "Lockstep's requeue to succeed")
    # Lockstep booked the spare n3 for it and told Slurm so (ReqNodeList): Slurm runs it there, not on the idle
    # n2 it would pick by itself, so a spare booked for one recovery cannot go to another's restart.
    assert squeue(slurm, slurm_id)["nodes"] == "n3"
    assert slurm_sync(cluster=slurm_cluster)["followed"] == {}  # nothing to realign
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and hosts(job) == ["n3"]
    history = job.allocations.order_by("created_at", "id").values_list("node__hostname", flat=True)
    assert list(history) == ["n1", "n3"]
    assert Node.objects.get(cluster=slurm_cluster, hostname="n3").state == NodeState.READY
    assert Node.objects.get(cluster=slurm_cluster, hostname="n2").state == NodeState.READY
    slurm.run("scancel", slurm_id)
