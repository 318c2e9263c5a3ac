"""Scenario ``ab-nic``: two identical all-reduce jobs start together, one on a protected cluster and one not;
the same NIC (same rail) fails under both. The protected one fails over to a healthy NIC and keeps running;
the other restarts from its checkpoint. The page /scenarios/<id>/ shows the two side by side, live."""

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from controlplane.access import principal, require
from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from fleet.models import Cluster
from fleet.selectors import cluster_protection
from jobs.services.faults import fault_ingest
from jobs.services.jobs import job_submit
from simulator.models import Scenario
from tenancy.models import Tenant

NIC = "mlx5_3"


def _pair() -> tuple[Cluster, Cluster]:
    shared = list(
        Cluster.objects.filter(dedicated_tenant__isnull=True, driver="simulated")
        .select_related("blueprint_version", "fleet")
        .order_by("name")
    )
    protected = [c for c in shared if cluster_protection(cluster=c).protected]
    unprotected = [c for c in shared if not cluster_protection(cluster=c).protected]
    if not protected or not unprotected:
        raise ServiceError(
            "needs a shared protected cluster and a shared unprotected one (build the demo world)", status=409
        )
    return protected[0], unprotected[0]


@transaction.atomic
def abnic_start(
    *,
    actor,
    gpus: int = 64,
    seconds_per_iteration: float = 2.0,
    checkpoint_interval: int = 300,
    strike_after_seconds: float = 90.0,
) -> Scenario:
    """Submit the two jobs and arm the NIC failure ``strike_after_seconds`` from now (provider roles)."""
    require(principal(actor).is_provider, "scenarios are for provider roles")
    protected, unprotected = _pair()
    tenant = Tenant.objects.order_by("name").first()
    if tenant is None:
        raise ServiceError("no tenant to run the jobs for", status=409)
    jobs = {}
    for label, cluster in (("protected", protected), ("unprotected", unprotected)):
        job, _ = job_submit(
            actor=actor,
            tenant=tenant,
            cluster=cluster,
            name=f"ab-nic-{label}",
            gpus=gpus,
            seconds_per_iteration=seconds_per_iteration,
            checkpoint_interval=checkpoint_interval,
            total_iterations=10_000_000,
        )
        jobs[label] = job.pk
    scenario = Scenario.objects.create(
        kind="ab-nic",
        jobs=jobs,
        nic_name=NIC,
        strike_at=timezone.now() + timedelta(seconds=strike_after_seconds),
    )
    audit_record(actor=actor, action="scenario.start", target=scenario, changes={"jobs": jobs, "nic": NIC})
    return scenario


def scenarios_advance(*, now=None) -> int:
    """Fire armed scenarios whose deadline passed (beat); each fires once (row lock + state)."""
    from jobs.models import Job

    now = now or timezone.now()
    fired = 0
    for scenario_id in Scenario.objects.filter(state=Scenario.State.ARMED, strike_at__lte=now).values_list(
        "pk", flat=True
    ):
        with transaction.atomic():
            scenario = (
                Scenario.objects.select_for_update(skip_locked=True)
                .filter(pk=scenario_id, state=Scenario.State.ARMED)
                .first()
            )
            if scenario is None:
                continue
            for job in Job.objects.filter(pk__in=scenario.jobs.values()):
                allocation = (
                    job.allocations.filter(released_at__isnull=True)
                    .select_related("node")
                    .order_by("rank_start")
                    .first()
                )
                if allocation is not None:
                    fault_ingest(
                        source="simulator",
                        kind="nic_down",
                        node=allocation.node,
                        nic_name=scenario.nic_name,
                        details={
                            "scenario": scenario.pk,
                            "why": "ab-nic: the same rail NIC fails under both jobs",
                        },
                    )
            scenario.state, scenario.fired_at = Scenario.State.FIRED, now
            scenario.save(update_fields=["state", "fired_at"])
            fired += 1
    return fired
