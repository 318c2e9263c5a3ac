"""Is a job protected? DESIGN's definition, per job.

- A simulated job: its cluster's blueprint policy turns protection on *and* the protection add-ons are observed
  InSync and Healthy there (``fleet.selectors.cluster_protection``).
- A real job (registered by a launcher, e.g. on Slurm): its cluster's blueprint policy turns the protection
  runtime on (``policy.protection.runtime: true``) *and* the job's protection runtime (``lockstep_agent.protect``)
  reports for it: a restore point, write-through or restore reported within ``RUNTIME_REPORT_SECONDS`` of the
  moment asked about. The reason names what is missing, both when both are.
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from fleet.selectors import ProtectionVerdict
from jobs.choices import RESTORE_POINT_KINDS, JobState, SnapshotKind, SnapshotReason
from jobs.models import Job, JobSnapshot

# The policy key that turns the protection runtime on for real jobs.
RUNTIME_POLICY_KEY = "runtime"
# Reports that show the runtime is alive and keeping restore points (hangs and disk fallbacks do not).
LIVE_KINDS = (*RESTORE_POINT_KINDS, SnapshotKind.RESTORE)


def runtime_report_seconds() -> float:
    """How recent the runtime's last report must be (default 60 s: six of its default 10 s report intervals)."""
    return float(getattr(settings, "PROTECTION_RUNTIME_REPORT_SECONDS", 60))


def runtime_policy_on(cluster) -> tuple[bool, str]:
    """Whether the cluster's blueprint policy turns the protection runtime on, and if not, why."""
    version = cluster.blueprint_version
    if version is None:
        return False, "the cluster carries no blueprint version"
    if not (version.effective_policy().get("protection") or {}).get(RUNTIME_POLICY_KEY):
        return (
            False,
            f"blueprint {version} does not turn on the protection runtime (policy protection.runtime)",
        )
    return True, f"blueprint {version} turns on the protection runtime"


def last_runtime_report(job: Job, at: datetime | None = None) -> JobSnapshot | None:
    """The job runtime's newest live report (restore point or restore) at ``at`` (now)."""
    rows = JobSnapshot.objects.filter(job=job, reason=SnapshotReason.RUNTIME, kind__in=LIVE_KINDS)
    if at is not None:
        rows = rows.filter(ended_at__lte=at)
    return rows.order_by("-ended_at", "-id").first()


def job_protection(
    job: Job, *, at: datetime | None = None, cluster_verdict=None, policy: tuple[bool, str] | None = None
) -> ProtectionVerdict:
    """DESIGN's "protected" for one job at ``at`` (now). ``cluster_verdict`` (the cluster's, for simulated jobs)
    and ``policy`` (``runtime_policy_on`` of its cluster, for real ones) may be passed when the caller already has
    them (a list: once per cluster)."""
    if job.simulated:
        if cluster_verdict is not None:
            return cluster_verdict
        from fleet.selectors import cluster_protection

        return cluster_protection(cluster=job.cluster)
    at = at or timezone.now()
    policy_on, policy_why = policy if policy is not None else runtime_policy_on(job.cluster)
    report = last_runtime_report(job, at)
    window = runtime_report_seconds()
    reporting = report is not None and report.ended_at >= at - timedelta(seconds=window)
    if report is None:
        runtime_why = "the protection runtime has not reported for this job"
    elif not reporting:
        age = (at - report.ended_at).total_seconds()
        runtime_why = (
            f"the protection runtime last reported {age:.0f} s ago (iteration {report.iteration}), "
            f"more than {window:.0f} s"
        )
    else:
        runtime_why = f"the protection runtime reports for it (iteration {report.iteration})"
    if policy_on and reporting:
        return ProtectionVerdict(True, f"{policy_why}; {runtime_why}")
    missing = [why for ok, why in ((policy_on, policy_why), (reporting, runtime_why)) if not ok]
    return ProtectionVerdict(False, "; and ".join(missing))


def cluster_jobs_protection(cluster, jobs: list[Job], *, at: datetime | None = None) -> dict:
    """What a page that lists a cluster says of protection, by the same verdict as each job's page: its running
    ``jobs`` (those of the reader, on this cluster) counted protected or not by ``job_protection``, and the verdict
    itself: protected when every one of them is; with none running, the verdict a job placed there would get (the
    cluster's add-on rule for a simulated cluster, the runtime policy for a real one, whose jobs are protected
    only once their runtime reports)."""
    from fleet.choices import DriverName
    from fleet.selectors import cluster_protection

    running = [job for job in jobs if job.cluster_id == cluster.pk and job.state == JobState.RUNNING]
    simulated = cluster_protection(cluster=cluster) if cluster.driver == DriverName.SIMULATED else None
    policy = None if simulated is not None else runtime_policy_on(cluster)
    verdicts = [job_protection(job, at=at, cluster_verdict=simulated, policy=policy) for job in running]
    protected = sum(1 for v in verdicts if v.protected)
    if running:
        unprotected = next((v for v in verdicts if not v.protected), None)
        verdict = ProtectionVerdict(
            unprotected is None,
            unprotected.reason if unprotected else verdicts[0].reason,
        )
    elif simulated is not None:
        verdict = simulated
    else:
        on, why = policy
        verdict = ProtectionVerdict(
            False, f"{why}; a job here is protected once its protection runtime reports" if on else why
        )
    return {"verdict": verdict, "protected": protected, "running": len(running)}
