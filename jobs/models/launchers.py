"""Launcher credentials (a token bound to one cluster and, for most, one tenant, for the job scripts a scheduler
starts) and the link between a Lockstep job and the scheduler's job (Slurm's job id)."""

from django.conf import settings
from django.db import models

from tenancy.models import Token


class LauncherCredential(Token):
    """``lsl_<prefix>_<secret>``, bound to one cluster: it may register only jobs of that cluster, named by their
    scheduler job id (``SLURM_JOB_ID``). With a ``tenant`` (always, on a cluster dedicated to one), only jobs whose
    Slurm account maps to that tenant; without one (cluster-wide), only on a cluster whose jobs prove themselves
    with their job secret (``jobs.launchers``)."""

    kind = "lsl"

    cluster = models.ForeignKey(
        "fleet.Cluster", on_delete=models.CASCADE, related_name="launcher_credentials"
    )
    tenant = models.ForeignKey(
        "tenancy.Tenant",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="launcher_credentials",
        help_text="the tenant whose jobs it registers; empty: cluster-wide (needs job secrets)",
    )
    name = models.CharField(max_length=100)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    tenant_scope = "cluster__dedicated_tenant_id"

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        scope = f"tenant {self.tenant_id}" if self.tenant_id else "all tenants"
        return f"launcher {self.name} ({self.prefix}…) for cluster {self.cluster_id}, {scope}"


class SlurmJob(models.Model):
    """A Slurm job Lockstep follows: what Slurm last said of it. ``job`` is its Lockstep job; a running job whose
    account maps to no tenant has none (``unmapped`` says why) and is listed to the provider only."""

    job = models.OneToOneField(
        "jobs.Job", null=True, blank=True, on_delete=models.CASCADE, related_name="slurm"
    )
    cluster = models.ForeignKey("fleet.Cluster", on_delete=models.CASCADE, related_name="+")
    slurm_job_id = models.CharField(max_length=30)
    account = models.CharField(max_length=100, blank=True)
    slurm_state = models.CharField(max_length=30, blank=True)
    nodes = models.CharField(max_length=300, blank=True, help_text="Slurm's node list as it last ran")
    restart_count = models.PositiveIntegerField(default=0)
    registered_at = models.DateTimeField(
        null=True, blank=True, help_text="when its launcher last registered it"
    )
    seen_at = models.DateTimeField(null=True, blank=True)
    unmapped = models.CharField(
        max_length=300,
        blank=True,
        db_default="",
        help_text="why it has no Lockstep job (no tenant for its account)",
    )

    tenant_scope = "job__tenant_id"

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "slurm_job_id"], name="slurm_job_unique_per_cluster")
        ]

    def __str__(self):
        return f"Slurm job {self.slurm_job_id} = job {self.job_id or '(unmapped)'}"
