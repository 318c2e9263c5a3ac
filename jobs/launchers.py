"""Launcher credentials and Slurm jobs: a job script registers itself, and Lockstep follows Slurm's jobs.

A launcher credential (``lsl_<prefix>_<secret>``) is bound to one cluster, like an agent token: with it a job
script started by that cluster's scheduler registers the job it runs in (named by ``SLURM_JOB_ID``) and gets the
job token its progress reports use. Lockstep looks the job up in *that cluster's* Slurm, so a credential can
never register or report a job of another cluster (naming another cluster is refused with 403; a job id its
own Slurm does not know is 404).

The Slurm account maps to a tenant through the cluster's connection settings (``accounts``: account → tenant
slug; ``default_tenant`` for the rest). A job of an unmapped account with no default tenant is not adopted: it is
kept as a ``SlurmJob`` with no Lockstep job, listed to the provider only (``GET /api/v1/slurm-jobs/?unmapped=true``),
registration answers 403, and a later sync adopts it once its account maps.
"""

import re

from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from fleet.choices import DriverName
from fleet.drivers import DriverError, driver_for
from fleet.services.cluster_tokens import cluster_token_issue, cluster_token_revoke
from jobs.choices import ACTIVE_JOB_STATES, IncidentState, JobState
from jobs.models import Incident, Job, LauncherCredential, SlurmJob
from jobs.services.jobs import job_submit, job_token_create
from tenancy.authentication import TokenAuthentication, TokenPrincipal
from tenancy.models import Tenant


# --- credentials ----------------------------------------------------------------------------------------------
def launcher_credential_create(*, actor, cluster, name: str) -> tuple[LauncherCredential, str]:
    """A new launcher credential for one cluster; the token is shown only now."""
    return cluster_token_issue(
        model=LauncherCredential, action="launcher_credential.create", actor=actor, cluster=cluster, name=name
    )


def launcher_credential_revoke(*, actor, credential: LauncherCredential) -> LauncherCredential:
    return cluster_token_revoke(action="launcher_credential.revoke", actor=actor, token=credential)


class LauncherPrincipal(TokenPrincipal):
    """request.user for a launcher: authenticated, no role; request.auth is the LauncherCredential."""

    name_template = "launcher:{token.prefix}"


class LauncherAuthentication(TokenAuthentication):
    """``Authorization: Bearer lsl_…``; other headers are left to the next authenticator."""

    model = LauncherCredential
    realm = "launcher"
    own_kind_only = True
    related = ("cluster",)
    malformed = "Malformed launcher credential: they look like lsl_xxxxxxxx_…."
    unknown = revoked = "Unknown or revoked launcher credential."
    principal = LauncherPrincipal


# --- what the Slurm driver asks of jobs (fleet.hooks) ----------------------------------------------------------
def node_reason(node) -> str:
    """The drain reason for a node: its open incident."""
    incident = (
        Incident.objects.filter(node_id=node.pk, state=IncidentState.OPEN)
        .order_by("-opened_at")
        .values_list("pk", "kind")
        .first()
    )
    return f"incident {incident[0]} ({incident[1]})" if incident else ""


def slurm_job_of(job_ref: str) -> str | None:
    if not job_ref.startswith("job-") or not job_ref[4:].isdigit():
        return None
    return SlurmJob.objects.filter(job_id=int(job_ref[4:])).values_list("slurm_job_id", flat=True).first()


# --- adopting Slurm jobs ----------------------------------------------------------------------------------------
def tenant_for_account(cluster, account: str) -> Tenant | None:
    """The tenant of a Slurm account by the cluster's mapping, else its default tenant; None when unmapped."""
    connection = cluster.connection or {}
    slug = (connection.get("accounts") or {}).get(account) or connection.get("default_tenant")
    return Tenant.objects.filter(slug=slug).first() if slug else None


def hostnames_of(slurm_job: dict) -> list[str]:
    allocated = (slurm_job.get("job_resources") or {}).get("allocated_nodes") or []
    return [entry["nodename"] for entry in allocated if entry.get("nodename")]


def gpus_of_job(slurm_job: dict, gpus_per_node: dict[str, int]) -> int:
    """GPUs the job holds: its gres/gpu TRES when it asked for GPUs, else all of its nodes' GPUs (whole nodes)."""
    found = re.search(r"gres/gpu=(\d+)", slurm_job.get("tres_alloc_str") or "")
    if found and int(found.group(1)) > 0:
        return int(found.group(1))
    return max(1, sum(gpus_per_node.get(host, 0) for host in hostnames_of(slurm_job)))


def slurm_job_adopt(*, cluster, slurm_job: dict, actor=None) -> SlurmJob:
    """The Lockstep job of a running Slurm job, registered with its nodes when it has none yet."""
    from fleet.models import GPU

    slurm_id = str(slurm_job["job_id"])
    link = SlurmJob.objects.select_related("job").filter(cluster=cluster, slurm_job_id=slurm_id).first()
    if link is not None and link.job_id is not None:
        return link
    if slurm_job.get("job_state") != "RUNNING":
        raise ServiceError(
            f"Slurm job {slurm_id} is {slurm_job.get('job_state', 'unknown').lower()}, not running",
            status=409,
        )
    account = slurm_job.get("account") or ""
    tenant = tenant_for_account(cluster, account)
    if tenant is None:
        raise ServiceError(
            f"Slurm account {account!r} maps to no tenant on cluster {cluster.name}", status=403
        )
    hostnames = hostnames_of(slurm_job)
    per_node = {
        row["node__hostname"]: row["n"]
        for row in GPU.objects.filter(node__cluster=cluster, node__hostname__in=hostnames)
        .values("node__hostname")
        .annotate(n=Count("id"))
    }
    job, _ = job_submit(
        actor=actor,
        tenant=tenant,
        cluster=cluster,
        name=f"{slurm_job.get('name') or 'slurm'}-{slurm_id}"[:100],
        gpus=gpus_of_job(slurm_job, per_node),
        hostnames=hostnames,
    )
    # A job listed before as unmapped (its account has a tenant now) keeps its row.
    link, _ = SlurmJob.objects.update_or_create(
        cluster=cluster,
        slurm_job_id=slurm_id,
        defaults={"job": job, **_as_reported(slurm_job), "unmapped": ""},
    )
    return link


def _as_reported(slurm_job: dict) -> dict:
    """A ``SlurmJob``'s fields as Slurm reports the job now."""
    return {
        "account": (slurm_job.get("account") or "")[:100],
        "slurm_state": (slurm_job.get("job_state") or "")[:30],
        "nodes": (slurm_job.get("nodes") or "")[:300],
        "restart_count": int(slurm_job.get("restart_cnt") or 0),
        "seen_at": timezone.now(),
    }


def slurm_job_unmapped(*, cluster, slurm_job: dict, why: str) -> SlurmJob:
    """List a running Slurm job Lockstep does not adopt (provider only): no tenant for its account, or its hosts
    held by another job. A later sync adopts it once its account maps."""
    link, _ = SlurmJob.objects.update_or_create(
        cluster=cluster,
        slurm_job_id=str(slurm_job["job_id"]),
        job__isnull=True,
        defaults={**_as_reported(slurm_job), "unmapped": why[:300]},
    )
    return link


def launcher_register(
    *, credential: LauncherCredential, slurm_job_id: str, cluster_named=None
) -> tuple[Job, str, SlurmJob]:
    """A job script registers the Slurm job it runs in: its Lockstep job (adopted now if the sync has not yet)
    and a new job token. Refused while a recovery of the job is under way (409: the requeue that started this run
    is not finished in Lockstep yet; the launcher retries)."""
    cluster = credential.cluster
    if cluster_named is not None and str(cluster_named) not in (str(cluster.pk), cluster.name):
        raise ServiceError("this launcher credential is bound to another cluster", status=403)
    if cluster.driver != DriverName.SLURM:
        raise ServiceError(f"cluster {cluster.name} is not a Slurm cluster", status=403)
    slurm_job_id = str(slurm_job_id).strip()
    if not slurm_job_id.isdigit() or len(slurm_job_id) > 20:
        raise ServiceError("a Slurm job id (digits)", field="slurm_job_id")
    try:
        found = driver_for(cluster).job(slurm_job_id)
    except DriverError as error:
        raise ServiceError(f"Slurm did not answer: {error}", status=503) from error
    if found is None:
        raise ServiceError(f"cluster {cluster.name} runs no Slurm job {slurm_job_id}", status=404)
    followed = SlurmJob.objects.filter(cluster=cluster, slurm_job_id=slurm_job_id, job__isnull=False).first()
    if followed is not None:
        # A run Slurm started on its own (a requeue Lockstep did not make) registers before the next sync sees it.
        from jobs.services.slurm_jobs import slurm_job_follow

        slurm_job_follow(
            link=followed,
            slurm_job=found,
            previous_restarts=followed.restart_count,
            previous_seen=followed.seen_at,
        )
    with transaction.atomic():
        link = slurm_job_adopt(cluster=cluster, slurm_job=found, actor=None)
        job = Job.objects.select_for_update(of=("self",), no_key=True).get(pk=link.job_id)
        if job.state == JobState.RECOVERING:
            raise ServiceError(f"job {job.pk} is recovering; register again once it runs", status=409)
        if job.state not in ACTIVE_JOB_STATES:
            raise ServiceError(f"job {job.pk} is {job.state}", status=409)
        link.restart_count = max(link.restart_count, int(found.get("restart_cnt") or 0))
        link.registered_at = timezone.now()
        link.save(update_fields=["restart_count", "registered_at"])
        raw = job_token_create(job=job)
        audit_record(
            actor=None,
            action="launcher.register",
            target=job,
            tenant_id=job.tenant_id,
            changes={
                "slurm_job_id": slurm_job_id,
                "credential": credential.prefix,
                "restart_count": link.restart_count,
            },
        )
    return job, raw, link
