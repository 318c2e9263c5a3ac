"""Incidents written straight to the database (intake links reports and recoveries to them in its own tests):
a world of two tenants' jobs on their dedicated clusters and on a shared one, and the incidents that hit them."""

import itertools
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from fleet.models import Cluster, Node
from jobs.models import FaultEvent, Incident, Job, RecoveryAction
from tests.support.jobs import INSTANT, node_of, protected_cluster, submit

_n = itertools.count(1)


def make_incident(node: Node, *, reports: list[dict], at=None, **fields) -> Incident:
    """An incident on ``node`` with one fault per entry of ``reports`` (kind, sources, xid, nic_name…)."""
    at = at or timezone.now()
    incident = Incident.objects.create(
        cluster_id=node.cluster_id,
        node=node,
        kind=fields.pop("kind", reports[0]["kind"]),
        opened_at=at,
        last_reported_at=at + timedelta(seconds=len(reports)),
        report_count=sum(r.get("report_count", 1) for r in reports),
        **fields,
    )
    for i, report in enumerate(reports):
        report = {"sources": ["agent"], **report}
        FaultEvent.objects.create(
            cluster_id=node.cluster_id,
            node=node,
            detected_at=at + timedelta(seconds=i),
            received_at=at + timedelta(seconds=i),
            correlation_key=f"incident-test-{next(_n)}",
            incident=incident,
            **report,
        )
    return incident


def make_action(
    incident: Incident,
    job: Job | None,
    *,
    kind: str = "live_migration",
    state: str = "succeeded",
    fault: bool = True,
    **fields,
) -> RecoveryAction:
    """A recovery of ``job`` for ``incident`` (naming its first fault unless ``fault`` is false)."""
    return RecoveryAction.objects.create(
        incident=incident,
        job=job,
        cluster_id=incident.cluster_id,
        node=incident.node,
        kind=kind,
        state=state,
        fault=incident.faults.order_by("pk").first() if fault else None,
        detected_at=incident.opened_at,
        gpus=job.gpus if job else 0,
        ended_at=timezone.now() if state in ("succeeded", "failed") else None,
        **fields,
    )


@dataclass
class IncidentWorld:
    acme_cluster: Cluster
    globex_cluster: Cluster
    shared: Cluster
    jobs: dict[str, Job]
    incidents: dict[str, Incident]
    actions: dict[str, RecoveryAction]
    orphan: FaultEvent


def incident_world(tenant_a, tenant_b) -> IncidentWorld:
    """acme (tenant_a) and globex (tenant_b), each with a dedicated cluster and a job on the shared one.

    Incidents: ``acme`` (two reports, a failed attempt and the restart that replaced it, an expected saving of a
    second acme job and a dry run), ``globex``, ``shared-acme`` (on acme's shared node, which hit globex's
    shared job as well), ``shared-globex``, and ``idle`` (a resolved one of no job). ``orphan`` is a fault of
    no incident on acme's cluster, which hit acme's job.
    """
    acme_cluster = protected_cluster(nodes=3, spares=1, tenant=tenant_a, connection=INSTANT)
    globex_cluster = protected_cluster(nodes=2, spares=1, tenant=tenant_b, connection=INSTANT)
    shared = protected_cluster(nodes=4, spares=1, connection=INSTANT)
    jobs = {
        "acme": submit(acme_cluster, tenant_a, gpus=8, name="acme-own"),
        "acme-2": submit(acme_cluster, tenant_a, gpus=8, name="acme-second"),
        "globex": submit(globex_cluster, tenant_b, gpus=8, name="globex-own"),
        "acme-shared": submit(shared, tenant_a, gpus=8, name="acme-shared"),
        "globex-shared": submit(shared, tenant_b, gpus=8, name="globex-shared"),
    }
    start = timezone.now() - timedelta(hours=1)
    incidents = {
        "acme": make_incident(
            node_of(jobs["acme"]),
            at=start,
            kind="gpu_xid",
            xid=79,
            reports=[
                {"kind": "gpu_xid", "xid": 79, "gpu_index": 3, "sources": ["agent"], "report_count": 2},
                {"kind": "node_unreachable", "sources": ["alertmanager", "api"]},
            ],
        ),
        "globex": make_incident(
            node_of(jobs["globex"]),
            at=start + timedelta(minutes=1),
            reports=[{"kind": "ecc_uncorrectable", "gpu_index": 1}],
        ),
        "shared-acme": make_incident(
            node_of(jobs["acme-shared"]),
            at=start + timedelta(minutes=2),
            scope="nic",
            nic_name="mlx5_2",
            reports=[{"kind": "nic_down", "nic_name": "mlx5_2"}],
        ),
        "shared-globex": make_incident(
            node_of(jobs["globex-shared"]),
            at=start + timedelta(minutes=3),
            reports=[{"kind": "node_unreachable", "sources": ["alertmanager"]}],
        ),
        "idle": make_incident(
            Node.objects.filter(cluster=shared, state="spare").first(),
            state="resolved",
            at=start + timedelta(minutes=4),
            resolved_at=start + timedelta(minutes=5),
            reports=[{"kind": "thermal", "sources": ["predictor"]}],
        ),
    }
    failed = make_action(
        incidents["acme"],
        jobs["acme"],
        state="failed",
        error="no spare of this model",
        gpu_hours_baseline=5.0,
        gpu_hours_lost=1.0,
    )
    actions = {
        "failed": failed,
        "restart": make_action(
            incidents["acme"],
            jobs["acme"],
            kind="restart_from_checkpoint",
            attempt=2,
            previous=failed,
            gpu_hours_baseline=10.0,
            gpu_hours_lost=2.0,
            gpu_hours_saved=8.0,
        ),
        "expected": make_action(
            incidents["acme"],
            jobs["acme-2"],
            kind="proactive_migration",
            saving="expected",
            gpu_hours_baseline=6.0,
            gpu_hours_lost=0.5,
            gpu_hours_expected=4.0,
        ),
        "dry-run": make_action(
            incidents["acme"],
            jobs["acme-2"],
            fault=False,
            dry_run=True,
            gpu_hours_baseline=100.0,
            gpu_hours_saved=90.0,
        ),
        "globex": make_action(
            incidents["globex"],
            jobs["globex"],
            gpu_hours_baseline=3.0,
            gpu_hours_saved=2.5,
            gpu_hours_lost=0.5,
        ),
        "shared-acme": make_action(
            incidents["shared-acme"],
            jobs["acme-shared"],
            kind="nic_failover",
            gpu_hours_baseline=2.0,
            gpu_hours_saved=1.5,
            gpu_hours_lost=0.5,
        ),
        "shared-acme-globex": make_action(
            incidents["shared-acme"],
            jobs["globex-shared"],
            kind="nic_failover",
            gpu_hours_baseline=7.0,
            gpu_hours_saved=6.0,
            gpu_hours_lost=1.0,
        ),
        "shared-globex": make_action(incidents["shared-globex"], jobs["globex-shared"]),
    }
    orphan = FaultEvent.objects.create(
        kind="link_flap",
        cluster=acme_cluster,
        node=node_of(jobs["acme"]),
        nic_name="mlx5_5",
        sources=["agent"],
        detected_at=start - timedelta(minutes=5),
        received_at=start - timedelta(minutes=5),
        correlation_key="orphan",
    )
    make_action_for_fault(orphan, jobs["acme"])
    return IncidentWorld(acme_cluster, globex_cluster, shared, jobs, incidents, actions, orphan)


def make_action_for_fault(fault: FaultEvent, job: Job) -> RecoveryAction:
    """A recovery of a fault that belongs to no incident (as before incidents)."""
    return RecoveryAction.objects.create(
        fault=fault,
        job=job,
        cluster_id=fault.cluster_id,
        node=fault.node,
        kind="nic_failover",
        state="succeeded",
        detected_at=fault.detected_at,
        gpus=job.gpus,
        ended_at=timezone.now(),
    )
