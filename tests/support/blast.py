"""A world for the rollout blast-radius tests (issue 53, item 3): versions that keep, drop or move protection,
two clusters and running real jobs of two tenants, one of them protected."""

from django.utils import timezone

from fleet.services.blueprints import blueprint_create, version_create
from jobs.choices import JobState, SnapshotKind, SnapshotReason, SnapshotState
from jobs.models import Job, JobSnapshot
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on
from tests.support.factories import make_fleet

GUARDED = {"protection": {"nic_failover": True, "runtime": True}}


def blast_world(actor, tenant_a, tenant_b) -> dict:
    """gpu-base v1 (no runtime protection), v2 and v3 (runtime on; v3 bumps an add-on), two clusters on v2; on the
    first a job of tenant A whose runtime reports (protected) and one whose runtime is silent, on the second a job
    of tenant B; gpu-other v1, another blueprint whose policy turns the same protection on."""
    bp, v1 = blueprint(actor, auto_rollout=False)
    v2 = version_create(actor=actor, blueprint=bp, addons=ADDONS, policy=GUARDED, activate=True)
    v3 = version_create(
        actor=actor,
        blueprint=bp,
        addons=bump(ADDONS, "gpu-operator", "24.9.1"),
        policy=GUARDED,
        activate=True,
    )
    other = blueprint_create(actor=actor, name="gpu-other", auto_rollout=False, drift_mode="notify")
    other_v1 = version_create(actor=actor, blueprint=other, addons=ADDONS, policy=GUARDED, activate=True)
    clusters = clusters_on(v2, 2, fleet=make_fleet("blast"), track_latest=False)
    job = {
        "tenant": tenant_a,
        "cluster": clusters[0],
        "gpus": 8,
        "simulated": False,
        "state": JobState.RUNNING,
    }
    guarded = Job.objects.create(name="guarded", **job)
    bare = Job.objects.create(name="bare", **job)
    theirs = Job.objects.create(**{**job, "name": "theirs", "tenant": tenant_b, "cluster": clusters[1]})
    report_runtime(guarded)
    return {
        "bp": bp,
        "v1": v1,
        "v2": v2,
        "v3": v3,
        "other": other_v1,
        "clusters": clusters,
        "jobs": {"guarded": guarded, "bare": bare, "theirs": theirs},
    }


def report_runtime(job: Job) -> JobSnapshot:
    """A restore point the job's protection runtime reports now (jobs.protection counts it as reporting)."""
    return JobSnapshot.objects.create(
        job=job,
        reason=SnapshotReason.RUNTIME,
        kind=SnapshotKind.SNAPSHOT,
        state=SnapshotState.SUCCEEDED,
        iteration=10,
        ended_at=timezone.now(),
    )
