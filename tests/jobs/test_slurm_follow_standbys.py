"""Following a Slurm job with standbys (issue 49): its Slurm allocation also lists its standbys and, after a rank
replacement (no requeue), the node it lost; neither holds a rank, so Lockstep's allocations stay on the hosts its
ranks run on (no Slurm needed: ``slurm_job_follow`` is given what squeue answers)."""

import pytest
from django.utils import timezone

from fleet.choices import DriverName
from fleet.models import Node
from jobs.choices import ActionKind, ActionState, JobState
from jobs.models import Job, JobAllocation, JobStandby, RecoveryAction, SlurmJob
from jobs.services.slurm_jobs import slurm_job_follow, sync_jobs
from tests.support.factories import make_cluster, make_fleet

pytestmark = pytest.mark.django_db


def test_standbys_and_replaced_nodes_are_not_ranks_of_the_job(tenant_a):
    cluster = make_cluster(make_fleet(), driver=DriverName.SLURM, connection={})
    n1, n2, n3, n4 = (
        Node.objects.create(cluster=cluster, hostname=f"n{i}", gpu_model="gpu") for i in range(1, 5)
    )
    job = Job.objects.create(
        tenant=tenant_a, cluster=cluster, name="train", gpus=2, simulated=False, state=JobState.RUNNING
    )
    link = SlurmJob.objects.create(job=job, cluster=cluster, slurm_job_id="41", seen_at=timezone.now())
    for rank, node in enumerate((n1, n3)):  # n3 was a standby that took n2's rank
        JobAllocation.objects.create(job=job, node=node, gpu_indices=[0], rank_start=rank, rank_end=rank)
    JobStandby.objects.create(job=job, node=n4)
    now = timezone.now()
    RecoveryAction.objects.create(
        job=job,
        cluster=cluster,
        kind=ActionKind.RANK_REPLACEMENT,
        state=ActionState.SUCCEEDED,
        node=n2,
        to_node=n3,
        detected_at=now,
        ended_at=now,
    )
    squeue = {
        "job_id": 41,
        "job_state": "RUNNING",
        "restart_cnt": 0,
        "start_time": int(now.timestamp()) - 60,
        "job_resources": {"allocated_nodes": [{"nodename": h} for h in ("n1", "n2", "n3", "n4")]},
    }
    assert slurm_job_follow(link=link, slurm_job=squeue, previous_restarts=0, previous_seen=now) == ""
    held = JobAllocation.objects.filter(job=job, released_at=None).order_by("rank_start")
    assert [a.node.hostname for a in held] == ["n1", "n3"]
    # Without the standby and the replacement known, the same answer would spread the job over all four.
    JobStandby.objects.all().delete()
    RecoveryAction.objects.all().delete()
    assert (
        slurm_job_follow(link=link, slurm_job=squeue, previous_restarts=0, previous_seen=now) == "realigned"
    )


def test_only_a_standby_lockstep_started_is_left_out_of_adoption_and_its_node_noted(tenant_a):
    cluster = make_cluster(
        make_fleet(), driver=DriverName.SLURM, connection={"default_tenant": tenant_a.slug}
    )
    for host in ("n5", "n6"):
        Node.objects.create(cluster=cluster, hostname=host, gpu_model="gpu")
    job = Job.objects.create(
        tenant=tenant_a, cluster=cluster, name="train", gpus=2, simulated=False, state=JobState.RUNNING
    )
    action = RecoveryAction.objects.create(
        job=job,
        cluster=cluster,
        kind=ActionKind.RANK_REPLACEMENT,
        state=ActionState.SUCCEEDED,
        detected_at=timezone.now(),
        estimate={"standby": {"slurm_job_id": "77", "outcome": "new standby asked for"}},
    )

    def standby(slurm_id: int, host: str) -> dict:
        return {
            "job_id": slurm_id,
            "job_state": "RUNNING",
            "account": "acme",
            "comment": "lockstep-standby-for=41",
            "job_resources": {"allocated_nodes": [{"nodename": host}]},
        }

    # Job 78 borrows the comment: nobody's standby, followed as any other job is.
    report = sync_jobs(cluster, [standby(77, "n5"), standby(78, "n6")])
    assert report["adopted"] == ["78"] and report["unmapped"] == []
    assert list(SlurmJob.objects.filter(cluster=cluster).values_list("slurm_job_id", flat=True)) == ["78"]
    action.refresh_from_db()
    assert action.estimate["standby"]["nodes"] == ["n5"]
