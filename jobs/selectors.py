"""Reads of the jobs app; each takes the user it reads for (DESIGN's permission table)."""

from django.db.models import Prefetch, Q, QuerySet

from controlplane.access import principal
from jobs.models import FaultEvent, Incident, Job, JobSnapshot, RecoveryAction, SlurmJob
from tenancy.scoping import restrict


def may_see_job_topic(who, job_id: int) -> bool:
    if who.is_provider:
        return True
    return who.tenant_id is not None and Job.objects.filter(pk=job_id, tenant_id=who.tenant_id).exists()


def job_list(*, user) -> QuerySet[Job]:
    return restrict(Job.objects.select_related("tenant", "cluster"), user)


def slurm_job_list(*, user) -> QuerySet[SlurmJob]:
    """The Slurm jobs Lockstep follows: tenant users see those of their jobs; those of unmapped accounts (no
    Lockstep job) only providers."""
    return restrict(SlurmJob.objects.select_related("job", "cluster"), user).order_by("cluster_id", "-seen_at", "-id")


def _hit_incidents(tenant_id: int) -> QuerySet:
    """Ids of the incidents a recovery of one of the tenant's jobs answered."""
    return RecoveryAction.objects.filter(job__tenant_id=tenant_id, incident__isnull=False).values("incident_id")


def _dedicated_or_hit(rows: QuerySet, user, hit) -> QuerySet:
    """What ``restrict`` lets the user see of ``rows`` (providers: all; tenant users: the rows on their dedicated
    clusters) and, for tenant users, the rows ``hit(tenant_id)`` names: those that touched their jobs."""
    who = principal(user)
    if who.is_provider or not who.is_authenticated or who.tenant_id is None:
        return restrict(rows, user)
    return restrict(rows, user) | rows.filter(hit(who.tenant_id))


def fault_list(*, user) -> QuerySet[FaultEvent]:
    """Providers: every fault. Tenant users: faults on their dedicated clusters and faults that hit their jobs
    (an action of their job names the fault, or the fault is a report of an incident that hit their job)."""
    return _dedicated_or_hit(FaultEvent.objects.select_related("node", "cluster"), user, lambda tenant_id: (
        Q(pk__in=RecoveryAction.objects.filter(job__tenant_id=tenant_id, fault__isnull=False).values("fault_id"))
        | Q(incident_id__in=_hit_incidents(tenant_id))))


def action_list(*, user) -> QuerySet[RecoveryAction]:
    """Providers: every action. Tenant users: the actions on their jobs."""
    rows = RecoveryAction.objects.select_related("job", "node", "to_node", "fault")
    who = principal(user)
    if who.is_authenticated and not who.is_provider and who.tenant_id is not None:
        return rows.filter(job__tenant_id=who.tenant_id)
    return restrict(rows, user)


def incident_list(*, user, actions: QuerySet[RecoveryAction] | None = None) -> QuerySet[Incident]:
    """Incidents scoped as faults are: providers see every one; tenant users those on their dedicated clusters
    and those that hit their jobs. Each comes with its faults (the reports the user may see, oldest first) and,
    given ``actions`` (a queryset of ``action_list``), with those of its actions."""
    rows = _dedicated_or_hit(Incident.objects.select_related("node"), user,
                             lambda tenant_id: Q(pk__in=_hit_incidents(tenant_id)))
    rows = rows.prefetch_related(Prefetch("faults", queryset=fault_list(user=user).order_by("detected_at", "id")))
    if actions is not None:
        rows = rows.prefetch_related(Prefetch("actions", queryset=actions.order_by("planned_at", "id")))
    return rows


def sources_of(incident: Incident) -> list[str]:
    """Every source that reported an incident (the union of its prefetched faults' sources), sorted."""
    return sorted({source for fault in incident.faults.all() for source in fault.sources})


def job_incidents(*, user, job: Job, limit: int = 50) -> list[Incident]:
    """The incidents that hit a job (through its recovery actions), newest first, each with its reports, its
    sources and the job's recovery attempts for it."""
    attempts = action_list(user=user).filter(job=job)
    rows = (incident_list(user=user, actions=attempts)
            .filter(pk__in=RecoveryAction.objects.filter(job=job, incident__isnull=False).values("incident_id")))
    found = list(rows[:limit])
    for incident in found:
        incident.sources = sources_of(incident)
    return found


def fault_feed(*, user, cluster=None, limit: int = 50) -> list[dict]:
    """The fault feed, newest first: one row per incident (``{"at", "incident"}``, its reports folded under it)
    and one per fault of no incident (``{"at", "fault"}``): the fleet's for provider roles, those that hit the
    tenant's jobs otherwise; one cluster's if ``cluster`` is given."""
    who = principal(user)
    faults, incidents = fault_list(user=user).filter(incident__isnull=True), incident_list(user=user)
    if not who.is_provider:
        faults = faults.filter(actions__job__tenant_id=who.tenant_id).distinct()
        incidents = incidents.filter(pk__in=_hit_incidents(who.tenant_id))
    if cluster is not None:
        faults, incidents = faults.filter(cluster=cluster), incidents.filter(cluster=cluster)
    rows = [{"at": incident.last_reported_at, "incident": incident}
            for incident in incidents.order_by("-last_reported_at", "-id")[:limit]]
    rows += [{"at": fault.received_at, "fault": fault} for fault in faults.order_by("-received_at", "-id")[:limit]]
    rows = sorted(rows, key=lambda row: row["at"], reverse=True)[:limit]
    for row in rows:
        if "incident" in row:
            row["incident"].sources = sources_of(row["incident"])
    return rows


def snapshot_list(*, user, job: Job) -> QuerySet[JobSnapshot]:
    return restrict(JobSnapshot.objects.filter(job=job), user)


def _application_xids() -> list[int]:
    """Xid codes the catalogue calls application errors (the tenant's code, not the node): the gate skips them."""
    from jobs.triage import catalogue, classify_xid

    rows = catalogue()
    verdicts = (classify_xid(code, rows) for code in rows)
    return sorted(v.xid for v in verdicts if v.application and not v.escalates)


def hardware_fault_count(cluster_ids: list[int], since, until) -> int:
    """fleet.hooks fault counter for the rollout gate: hardware faults a node-level change can cause
    (``NODE_HARDWARE_KINDS``, less application Xids) detected on these clusters' nodes in [since, until), one per
    incident (the agent's Xid 79 and Alertmanager's NodeDown of one failure count once)."""
    from django.db.models import Count

    from jobs.choices import NODE_HARDWARE_KINDS

    rows = (FaultEvent.objects.filter(cluster_id__in=cluster_ids, detected_at__gte=since, detected_at__lt=until,
                                      kind__in=NODE_HARDWARE_KINDS)
            .exclude(kind="gpu_xid", xid__in=_application_xids()))
    counts = rows.aggregate(incidents=Count("incident", distinct=True), loose=Count("pk", filter=Q(incident__isnull=True)))
    return counts["incidents"] + counts["loose"]
