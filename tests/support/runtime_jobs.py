"""Real jobs (they report their own progress) on a cluster whose blueprint policy turns the protection runtime on,
and the runtime's reports through the API with the job token (tests/jobs: protection, in-job recovery)."""

from django.conf import settings

from fleet.choices import NodeState
from fleet.models import BlueprintVersion
from jobs.models import Job, JobSnapshot
from jobs.services.estimates import estimates_record
from tests.support.factories import make_blueprint, make_cluster, make_fleet
from tests.support.jobs import INSTANT, bulk_nodes, submit

POINT = {"kind": "snapshot", "seconds": 0.02, "bytes": 8_000_000}


def runtime_cluster(*, policy_on: bool = True, nodes: int = 3, spares: int = 1):
    """A cluster whose blueprint policy turns the protection runtime on (or not), without protection add-ons. Moving
    a worker has measured ten minutes there, so a restore is the cheaper recovery that needs a spare."""
    _, version = make_blueprint()
    policy = {"protection": {"runtime": True}} if policy_on else {"protection": {"nic_failover": True}}
    BlueprintVersion.objects.filter(pk=version.pk).update(policy=policy)
    version.refresh_from_db()
    cluster = make_cluster(
        make_fleet(), connection=INSTANT, blueprint_version=version, restart_overhead_minutes=10
    )
    bulk_nodes(cluster, nodes, prefix=f"{cluster.name}-n")
    bulk_nodes(cluster, spares, state=NodeState.SPARE, prefix=f"{cluster.name}-s")
    estimates_record([(cluster.pk, "migration_pause", 600.0)] * settings.RECOVERY_ESTIMATE_MIN_SAMPLES)
    return cluster


def real_job(cluster, tenant, api, *, iteration: int = 500, checkpoint: int = 400):
    """A real job that reports its own progress: a checkpoint, then steps past it. A job's kind is fixed when it
    is made (its reports do not change it), and real jobs are registered on named hosts of a real cluster; here
    the cluster's driver is the instant simulated one (no Slurm: tests/slurm does the same on a real Slurm), so
    the job is placed by it and then made of the real kind, as a launcher's registration makes it."""
    job = submit(cluster, tenant, gpus=16, checkpoint_interval=100_000)
    Job.objects.filter(pk=job.pk).update(simulated=False, reports_progress=True)
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {job.token}")
    for at, saved in ((checkpoint, True), (iteration, False)):
        answer = api.post(
            f"/api/v1/jobs/{job.pk}/progress/",
            {"iteration": at, "step_seconds": 0.5, "checkpoint": saved},
            format="json",
        )
        assert answer.status_code == 200, answer.content
    job.refresh_from_db()
    job.token = api._credentials["HTTP_AUTHORIZATION"].split()[1]
    assert not job.simulated and job.reports_progress
    return job


def report(api, job, **body):
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {job.token}")
    answer = api.post(f"/api/v1/jobs/{job.pk}/snapshots/", body, format="json")
    assert answer.status_code == 201, answer.content
    return JobSnapshot.objects.get(pk=answer.json()["id"])


def registered_on(job, hostnames) -> None:
    """As a launcher registers a job on its whole Slurm allocation, standbys too: an allocation of the job on each
    of ``hostnames`` past its ranks (its runtime's first report naming them its standbys releases them)."""
    from fleet.models import Node
    from jobs.models import JobAllocation

    rank = max(job.allocations.values_list("rank_end", flat=True), default=-1) + 1
    for node in Node.objects.filter(cluster_id=job.cluster_id, hostname__in=list(hostnames)).order_by(
        "hostname"
    ):
        JobAllocation.objects.create(job=job, node=node, gpu_indices=[0], rank_start=rank, rank_end=rank)
        rank += 1
