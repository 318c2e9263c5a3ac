"""Draining a node of a real Slurm cluster: Lockstep drains it in Slurm, its job (unprotected: no protection
runtime) is requeued off it onto the spare Lockstep booked, and once nothing of it is left the drain completes
(real Slurm, no fakes)."""

import json

import pytest

from fleet.choices import NodeState
from fleet.models import Node
from fleet.services.nodes import node_drain
from jobs.choices import ActionKind, FaultKind
from jobs.models import FaultEvent, RecoveryAction, SlurmJob
from jobs.services.advance import recovery_advance
from jobs.services.drain import drain_request, drains_advance
from jobs.services.faults import fault_handle
from jobs.services.slurm_jobs import slurm_sync
from tests.support.slurm import sbatch, wait

pytestmark = pytest.mark.django_db(transaction=True)


def squeue(slurm, slurm_id: str) -> dict:
    return json.loads(slurm.run("squeue", "--json", "--all", "--jobs", slurm_id).stdout)["jobs"][0]


def test_a_drained_slurm_node_s_job_is_requeued_on_the_spare_and_the_drain_completes(slurm, slurm_cluster):
    slurm_id = sbatch(
        slurm, "-N", "1", "--requeue", "-A", "acme", "-J", "one", "-o", "/dev/null", "--wrap", "sleep 300"
    )
    wait(lambda: squeue(slurm, slurm_id)["job_state"] == "RUNNING", what="the job to run")
    slurm_sync(cluster=slurm_cluster)
    job = SlurmJob.objects.get(cluster=slurm_cluster, slurm_job_id=slurm_id).job
    n1 = Node.objects.get(cluster=slurm_cluster, hostname="n1")
    assert list(job.allocations.filter(released_at__isnull=True).values_list("node_id", flat=True)) == [n1.pk]

    node_drain(actor=None, node=n1, reason="firmware update")
    sinfo = next(n for n in json.loads(slurm.run("sinfo", "--json").stdout)["nodes"] if n["name"] == "n1")
    assert "DRAIN" in sinfo["state_flags"] and sinfo["reason"].startswith("lockstep: ")
    [request_id] = drain_request(node_ids=[n1.pk])
    [action_id] = fault_handle(fault_id=request_id)
    action = RecoveryAction.objects.get(pk=action_id)
    assert action.kind == ActionKind.RESTART_FROM_CHECKPOINT and "not protected" in action.reason

    def completed():
        slurm_sync(cluster=slurm_cluster)
        recovery_advance(cluster_ids=[slurm_cluster.pk])
        drains_advance()
        return Node.objects.get(pk=n1.pk).state == NodeState.CORDONED

    wait(completed, 90, "the requeue to succeed and the drain to complete")
    action.refresh_from_db()
    assert action.state == "succeeded"
    assert squeue(slurm, slurm_id)["nodes"] == "n3"  # the spare Lockstep booked, not the drained n1
    hosts = job.allocations.filter(released_at__isnull=True).values_list("node__hostname", flat=True)
    assert list(hosts) == ["n3"]
    assert FaultEvent.objects.get(kind=FaultKind.DRAIN, node=n1).state == "handled"
    sinfo = next(n for n in json.loads(slurm.run("sinfo", "--json").stdout)["nodes"] if n["name"] == "n1")
    assert "DRAIN" in sinfo["state_flags"]  # cordoned is still Slurm's DRAIN: nothing new placed there
    slurm.run("scancel", slurm_id)
