"""Launcher credentials and Slurm jobs: a job script registers itself, and Lockstep follows Slurm's jobs.

A launcher credential (``lsl_<prefix>_<secret>``) is bound to one cluster, like an agent token: with it a job
script started by that cluster's scheduler registers the job it runs in (named by ``SLURM_JOB_ID``) and gets the
job token its progress reports use. Lockstep looks the job up in *that cluster's* Slurm, so a credential can
never register or report a job of another cluster (naming another cluster is refused with 403; a job id its
own Slurm does not know is 404).

Who may register which job (issue 54, H1: every tenant's job scripts hold the credential, so holding it proves
nothing about which job one is):

- A credential is bound to a tenant (on a cluster dedicated to one tenant, always to that one) and registers only
  jobs whose Slurm account maps to that tenant (403 otherwise, nothing written).
- A cluster whose connection has ``job_secret_key`` asks every registration for the job's secret (``job_secret``):
  HMAC-SHA256 under that key of the Slurm cluster name, job id, user id and account, which the
  cluster's root Slurm prolog derives with the same key (a root-only file on the nodes) and hands to the job's
  tasks only (``lockstep_agent.launcher``). Another job, even of the same tenant, cannot name this one.
- A credential with no tenant (cluster-wide: one the provider puts in every job's environment) registers only on
  a cluster that asks for job secrets: there the secret, not the credential, says which job is asking.

A registration revokes the job's earlier job tokens: the newest run's token is the only one that reports. Its
audit entry names the credential, its tenant, the job, its tenant and the Slurm job.

The Slurm account maps to a tenant through the cluster's connection settings (``accounts``: account → tenant
slug; ``default_tenant`` for the rest). A job of an unmapped account with no default tenant is not adopted: it is
kept as a ``SlurmJob`` with no Lockstep job, listed to the provider only (``GET /api/v1/slurm-jobs/?unmapped=true``),
registration answers 403, and a later sync adopts it once its account maps.
"""

import hashlib
import hmac
import logging
import re

from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from controlplane.audit import audit_entry, audit_record_many
from controlplane.errors import ServiceError
from fleet.choices import DriverName
from fleet.drivers import DriverError, driver_for
from fleet.services.cluster_tokens import cluster_token_issue, cluster_token_revoke
from jobs.choices import ACTIVE_JOB_STATES, IncidentState, JobState
from jobs.models import Incident, Job, JobToken, LauncherCredential, SlurmJob
from jobs.services.jobs import job_submit
from tenancy.authentication import TokenAuthentication, TokenPrincipal
from tenancy.models import Tenant
from tenancy.services import token_issue

logger = logging.getLogger(__name__)
# The shortest job_secret_key Lockstep accepts (``python -m lockstep_agent.launcher new-key`` makes 64 hex digits).
JOB_SECRET_KEY_MIN_LENGTH = 32
SLURM_NO_VAL = 0xFFFFFFFE


# --- credentials ----------------------------------------------------------------------------------------------
def launcher_credential_create(
    *, actor, cluster, name: str, tenant: Tenant | None = None
) -> tuple[LauncherCredential, str]:
    """A new launcher credential for one cluster and the jobs of one tenant; the token is shown only now. On a
    cluster dedicated to a tenant it is that tenant's (naming another is refused); with no tenant on a shared
    cluster it is cluster-wide, and registers only where jobs prove themselves (``job_secret_key``)."""
    dedicated = cluster.dedicated_tenant_id
    if tenant is not None and dedicated is not None and tenant.pk != dedicated:
        raise ServiceError("the cluster is dedicated to another tenant", field="tenant")
    if tenant is None and dedicated is not None:
        tenant = cluster.dedicated_tenant
    return cluster_token_issue(
        model=LauncherCredential,
        action="launcher_credential.create",
        actor=actor,
        cluster=cluster,
        name=name,
        tenant=tenant,
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
    noted = True  # audit entries of its requests name the credential
    related = ("cluster", "tenant")
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


def job_secret_key(cluster) -> str:
    """The cluster's job-secret key ('' when its jobs are not asked to prove themselves)."""
    key = str((cluster.connection or {}).get("job_secret_key") or "").strip()
    if key and len(key) < JOB_SECRET_KEY_MIN_LENGTH:
        # The provider's setting is wrong, not the job: no registration can be checked until it is fixed.
        raise ServiceError(
            f"cluster {cluster.name}'s job_secret_key is shorter than {JOB_SECRET_KEY_MIN_LENGTH} characters; "
            "the provider must set the key its Slurm prolog uses",
            status=503,
        )
    return key


def job_secret_of(key: str, slurm_job: dict) -> str:
    """The secret of a Slurm job (all its runs), as Slurm reports the job: what the cluster's prolog derived for
    it (``lockstep_agent.launcher.job_secret``, the same formula)."""
    message = "\n".join(
        [
            "lockstep-job-secret/1",
            str(slurm_job.get("cluster") or ""),
            str(slurm_job.get("job_id")),
            str(int(slurm_job.get("user_id") or 0)),
            str(slurm_job.get("account") or ""),
        ]
    )
    return hmac.new(key.encode(), message.encode(), hashlib.sha256).hexdigest()


def _refused(credential: LauncherCredential, slurm_job_id: str, message: str, *, status: int = 403):
    """A refused registration: nothing is written, the answer says why, the log says who tried."""
    logger.warning(
        "launcher %s (tenant %s) refused for Slurm job %s on cluster %s: %s",
        credential.prefix,
        credential.tenant_id,
        slurm_job_id,
        credential.cluster.name,
        message,
    )
    return ServiceError(message, status=status)


def job_token_replace(*, job: Job) -> tuple[JobToken, str, int]:
    """A new job token for ``job`` (shown once), its earlier ones revoked: only the newest registration's token
    reports for the job. Returns the row, the token and how many were revoked. In the caller's transaction."""
    revoked = JobToken.objects.filter(job=job, revoked_at__isnull=True).update(revoked_at=timezone.now())
    token, raw = token_issue(model=JobToken, job=job)
    return token, raw, revoked


def launcher_register(
    *, credential: LauncherCredential, slurm_job_id: str, job_secret: str = "", cluster_named=None
) -> tuple[Job, str, SlurmJob]:
    """A job script registers the Slurm job it runs in: its Lockstep job (adopted now if the sync has not yet)
    and a new job token, the job's earlier tokens revoked. The job must be one the credential may register (its
    tenant's; with its job secret where the cluster asks for one: module docstring); refused with 403 and
    nothing written otherwise. Refused while a recovery of the job is under way (409: the requeue that started
    this run is not finished in Lockstep yet; the launcher retries)."""
    cluster = credential.cluster
    slurm_job_id, key = _registration_asked(credential, slurm_job_id, cluster_named)
    try:
        found = driver_for(cluster).job(slurm_job_id)
    except DriverError as error:
        raise ServiceError(f"Slurm did not answer: {error}", status=503) from error
    if found is None:
        raise ServiceError(f"cluster {cluster.name} runs no Slurm job {slurm_job_id}", status=404)
    followed = _job_proven(credential, found, key=key, job_secret=job_secret)
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
        job = (
            Job.objects.select_for_update(of=("self",), no_key=True)
            .select_related("tenant")
            .get(pk=link.job_id)
        )
        if job.state == JobState.RECOVERING:
            raise ServiceError(f"job {job.pk} is recovering; register again once it runs", status=409)
        if job.state not in ACTIVE_JOB_STATES:
            raise ServiceError(f"job {job.pk} is {job.state}", status=409)
        link.restart_count = max(link.restart_count, int(found.get("restart_cnt") or 0))
        link.registered_at = timezone.now()
        link.save(update_fields=["restart_count", "registered_at"])
        token, raw, revoked = job_token_replace(job=job)
        _audit_registration(credential, job, link, token=token, revoked=revoked, proven=bool(key))
    return job, raw, link


def _registration_asked(credential: LauncherCredential, slurm_job_id, cluster_named) -> tuple[str, str]:
    """What can be refused before asking Slurm: another cluster, not Slurm, not a job id, a cluster-wide
    credential where jobs do not prove themselves. Returns the job id and the cluster's job-secret key."""
    cluster = credential.cluster
    if cluster_named is not None and str(cluster_named) not in (str(cluster.pk), cluster.name):
        raise ServiceError("this launcher credential is bound to another cluster", status=403)
    if cluster.driver != DriverName.SLURM:
        raise ServiceError(f"cluster {cluster.name} is not a Slurm cluster", status=403)
    slurm_job_id = str(slurm_job_id).strip()
    # Slurm's job ids are 32-bit, 0 and its NO_VAL/INFINITE markers excluded (squeue refuses them).
    if not (slurm_job_id.isascii() and slurm_job_id.isdigit() and 0 < int(slurm_job_id) < SLURM_NO_VAL):
        raise ServiceError("a Slurm job id (digits)", field="slurm_job_id")
    slurm_job_id = str(int(slurm_job_id))
    key = job_secret_key(cluster)
    if not (credential.tenant_id or cluster.dedicated_tenant_id or key):
        raise _refused(
            credential,
            slurm_job_id,
            f"this launcher credential is for no tenant, and cluster {cluster.name} does not ask jobs to prove "
            "themselves, so a cluster-wide credential registers nothing there (the provider issues one per "
            "tenant, or sets the cluster's job_secret_key and its Slurm prolog)",
        )
    return slurm_job_id, key


def _job_proven(credential: LauncherCredential, found: dict, *, key: str, job_secret: str) -> SlurmJob | None:
    """Refuse (403) a job that has not proven itself (its secret, where the cluster asks for one; checked first,
    so that a caller without it learns nothing of the job) or is not the credential's tenant's. Returns the
    job's link when Lockstep follows it already."""
    cluster, slurm_job_id = credential.cluster, str(found["job_id"])
    if key and not job_secret:
        raise _refused(
            credential,
            slurm_job_id,
            f"cluster {cluster.name} asks each job to prove itself: send job_secret, the "
            "LOCKSTEP_JOB_SECRET the cluster's Slurm prolog put in the job's environment",
        )
    if key and not hmac.compare_digest(job_secret_of(key, found).encode(), str(job_secret).encode()):
        raise _refused(credential, slurm_job_id, f"job_secret is not the secret of Slurm job {slurm_job_id}")
    followed = (
        SlurmJob.objects.select_related("job")
        .filter(cluster=cluster, slurm_job_id=slurm_job_id, job__isnull=False)
        .first()
    )
    tenant_id = credential.tenant_id or cluster.dedicated_tenant_id
    if tenant_id is not None:
        mapped = tenant_for_account(cluster, found.get("account") or "")
        owner = followed.job.tenant_id if followed else getattr(mapped, "pk", None)
        if owner != tenant_id:
            raise _refused(
                credential,
                slurm_job_id,
                f"this launcher credential registers the jobs of one tenant; Slurm job {slurm_job_id} is not one "
                "of them (its account maps to no tenant or another)",
            )
    return followed


def _audit_registration(credential, job: Job, link: SlurmJob, *, token: JobToken, revoked: int, proven: bool):
    """The registration's audit entry: by the credential (not "system"), naming its tenant, the job, the job's
    tenant, the Slurm job and the token it replaced."""
    entry = audit_entry(
        actor=None,
        action="launcher.register",
        target=job,
        tenant_id=job.tenant_id,
        changes={
            "slurm_job_id": link.slurm_job_id,
            "cluster": credential.cluster.name,
            "job": job.pk,
            "tenant": job.tenant.slug,
            "credential": credential.prefix,
            "credential_id": credential.pk,
            "credential_name": credential.name,
            "credential_tenant": credential.tenant.slug if credential.tenant_id else None,
            "job_secret": "verified" if proven else "not asked",
            "restart_count": link.restart_count,
            "job_token": token.prefix,
            "job_tokens_revoked": revoked,
        },
    )
    entry.actor_name, entry.token_prefix = f"launcher:{credential.prefix}", credential.prefix
    audit_record_many([entry])
