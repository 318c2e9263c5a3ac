"""Reads of the jobs app; each takes the user it reads for (DESIGN's permission table)."""

from django.db.models import Q, QuerySet

from controlplane.access import principal
from jobs.models import FaultEvent, Job, JobSnapshot, RecoveryAction
from tenancy.scoping import restrict


def may_see_job_topic(who, job_id: int) -> bool:
    if who.is_provider:
        return True
    return who.tenant_id is not None and Job.objects.filter(pk=job_id, tenant_id=who.tenant_id).exists()


def job_list(*, user) -> QuerySet[Job]:
    return restrict(Job.objects.select_related("tenant", "cluster"), user)


def fault_list(*, user) -> QuerySet[FaultEvent]:
    """Providers: every fault. Tenant users: faults on their dedicated clusters and faults that hit their jobs."""
    who = principal(user)
    rows = FaultEvent.objects.select_related("node", "cluster")
    if not who.is_authenticated:
        return rows.none()
    if who.is_provider:
        return rows
    if who.tenant_id is None:
        return rows.none()
    mine = Q(cluster__dedicated_tenant_id=who.tenant_id) | Q(pk__in=RecoveryAction.objects.filter(
        job__tenant_id=who.tenant_id, fault__isnull=False).values("fault_id"))
    return rows.filter(mine)


def action_list(*, user) -> QuerySet[RecoveryAction]:
    """Providers: every action. Tenant users: the actions on their jobs."""
    rows = RecoveryAction.objects.select_related("job", "node", "to_node", "fault")
    who = principal(user)
    if who.is_authenticated and not who.is_provider and who.tenant_id is not None:
        return rows.filter(job__tenant_id=who.tenant_id)
    return restrict(rows, user)


def snapshot_list(*, user, job: Job) -> QuerySet[JobSnapshot]:
    return restrict(JobSnapshot.objects.filter(job=job), user)
