"""The audit trail covers every write: each write operation of the OpenAPI schema and each form page that
takes a POST, done successfully, leaves an audit entry naming who did it (the user), what (the action) and
to which object (its type and id).

The operations come from the schema drf-spectacular builds and the form pages from the URLconf (through the
isolation matrix's declarations), so a new write without an entry here fails ``test_every_write_is_covered``.
Each write runs in a transaction that is rolled back, over the isolation matrix's world (committed once for
the module, flushed afterwards).
"""

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import yaml
from django.core.management import call_command
from django.db import transaction
from django.test import Client
from drf_spectacular.generators import SchemaGenerator

from controlplane.models import AuditEntry
from tests.support.matrix import ROUTES, MatrixWorld, matrix_world_build

pytestmark = pytest.mark.django_db

WRITE_METHODS = ("post", "put", "patch", "delete")


def schema_writes() -> dict[str, tuple[str, str]]:
    """operationId -> (method, path) of every write operation of the OpenAPI schema."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return {
        operation["operationId"]: (method.upper(), path)
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        if method in WRITE_METHODS
    }


def form_pages() -> set[str]:
    """Pages (not the API, not Django's admin) that take a POST, as the isolation matrix declares them."""
    return {name for name, route in ROUTES.items() if not name.startswith("api:") and "POST" in route.methods}


# Writes that leave no audit entry, and why. Anything else must.
EXEMPT = {
    "api_v1_ingest_telemetry_create": "node telemetry from agents (agent tokens), kept as its own rows per batch id",
    "logout": "ends the caller's own session; changes no data",
    "api_v1_blueprint_sources_webhook_create": "a git host's signed push: queues a poll, whose versions are audited",
    # Audited (launcher.register), but only a real Slurm can answer for the job: tests/slurm checks its entry.
    "api_v1_launchers_register_create": "a launcher registers its Slurm job; its audit entry is checked in tests/slurm",
}


class World:
    """The matrix world plus what a write spec needs to look up."""

    def __init__(self, built: MatrixWorld):
        self.built = built

    def id(self, kind: str, owner: str) -> int:
        return next(pk for who, pk in self.built.objects[kind] if who == owner)

    def user(self, role: str):
        return self.built.users[role]

    @property
    def padmin(self):
        return self.user("provider-admin")

    def cluster(self, owner: str):
        from fleet.models import Cluster

        return Cluster.objects.get(pk=self.id("cluster", owner))

    def idle_node(self, owner: str = "provider"):
        """A ready node of the owner's cluster that runs no job."""
        from fleet.models import Node
        from jobs.models import JobAllocation

        busy = JobAllocation.objects.filter(released_at__isnull=True).values("node_id")
        return (
            Node.objects.filter(cluster=self.cluster(owner), state="ready")
            .exclude(pk__in=busy)
            .order_by("hostname")
            .first()
        )

    def blueprint(self, name: str):
        from fleet.models import Blueprint

        return Blueprint.objects.get(name=name)

    def new_version(self, name: str, *, activate: bool):
        from fleet.services.blueprints import version_create

        blueprint = self.blueprint(name)
        latest = blueprint.versions.order_by("-number").first()
        return version_create(
            actor=self.padmin,
            blueprint=blueprint,
            addons=latest.addons,
            node_software=latest.node_software,
            policy=latest.policy,
            notes="audit",
            activate=activate,
        )

    def running_rollout(self):
        from fleet.models import Rollout

        return Rollout.objects.get(pk=self.id("rollout", "provider"))


@dataclass
class Write:
    """How to do a write successfully and what its audit entry must name. ``prepare`` makes what the write
    needs (and returns values the other callables read as ``ctx``); ``target`` gives the (object type, id)
    the entry must name from the world, the context and the answer."""

    role: str
    path: Callable[[World, dict], dict] = lambda w, ctx: {}
    body: Callable[[World, dict], object] = lambda w, ctx: {}
    target: Callable[[World, dict, object], tuple[str, str]] = lambda w, ctx, response: ("", "")
    action: str = ""
    prepare: Callable[[World], dict] = lambda w: {}
    content_type: str = "application/json"
    status: int = 200


def _with_source(w: World) -> dict:
    from fleet.models import BlueprintSource

    blueprint = w.blueprint("gpu-base")
    BlueprintSource.objects.create(blueprint=blueprint, url="https://git.example.org/fleet.git")
    return {"id": blueprint.pk}


def created(model: str) -> Callable:
    return lambda w, ctx, response: (model, str(response.json()["id"]))


def at(model: str, key: str = "id") -> Callable:
    return lambda w, ctx, response: (model, str(ctx[key]))


def webhook(hostname: str) -> dict:
    alert = {
        "status": "firing",
        "labels": {"alertname": "GPUXidError", "Hostname": hostname, "gpu": "2"},
        "annotations": {"value": "79", "summary": f"Xid 79 on {hostname}"},
        "startsAt": "2026-11-30T05:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": "audit-1",
    }
    return {
        "version": "4",
        "groupKey": "{}",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "lockstep",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": [alert],
    }


def _draft(w):
    version = w.new_version("gpu-base", activate=False)
    return {"id": w.blueprint("gpu-base").pk, "number": version.number, "version": version.pk}


def _active(w):
    version = w.new_version("gpu-base", activate=True)
    return {"id": w.blueprint("gpu-base").pk, "number": version.number, "version": version.pk}


def _doomed_cluster(w):
    from fleet.services.clusters import cluster_create

    cluster = cluster_create(
        actor=w.padmin,
        fleet=w.cluster("provider").fleet,
        name="audit-doomed",
        region="x",
        kind="kubernetes",
        driver="simulated",
    )
    return {"id": cluster.pk}


def _empty_fleet(w):
    from fleet.services.clusters import fleet_create

    return {"id": fleet_create(actor=w.padmin, name="audit-empty").pk}


def _failed_node_fault(w):
    from jobs.choices import EscalationStage
    from jobs.models import FaultEvent, NodeEscalation

    fault = FaultEvent.objects.get(pk=w.id("fault", "provider"))
    NodeEscalation.objects.update_or_create(node=fault.node, defaults={"stage": EscalationStage.FAILED})
    return {"id": fault.pk, "node": fault.node_id}


def _launcher_credential(w) -> int:
    from jobs.launchers import launcher_credential_create

    return launcher_credential_create(actor=w.padmin, cluster=w.cluster("provider"), name="audit doomed")[
        0
    ].pk


def _protected_job(w):
    from jobs.services.jobs import job_submit
    from tenancy.models import Tenant

    job, _ = job_submit(
        actor=w.padmin,
        tenant=Tenant.objects.get(slug="nimbus"),
        cluster=w.cluster("nimbus"),
        name="audit-snapshot",
        gpus=8,
        total_iterations=1000,
    )
    return {"id": job.pk}


def _cordoned(w):
    from fleet.services.nodes import node_cordon

    node = w.idle_node()
    node_cordon(actor=w.padmin, node=node)
    return {"id": node.pk}


def _paused_rollout(w):
    from fleet.services.rollouts import rollout_pause

    rollout = rollout_pause(actor=w.padmin, rollout=w.running_rollout())
    return {"id": rollout.pk}


def _yaml_document(w):
    from fleet import blueprint_yaml

    blueprint = w.blueprint("gpu-base")
    document = yaml.safe_load(blueprint_yaml.dump(blueprint))
    document["description"] = "changed through the YAML document"
    return {"id": blueprint.pk, "document": yaml.safe_dump(document)}


def _new_resilient_version(w):
    version = w.new_version("gpu-resilient", activate=True)
    return {"blueprint": w.blueprint("gpu-resilient").pk, "number": version.number}


def _room_for_scenario(w):
    """The A/B scenario starts a 64-GPU job on each shared cluster: give them every node back."""
    from fleet.choices import NodeState
    from fleet.models import Node
    from jobs.models import Job
    from jobs.services.jobs import job_cancel

    for job in Job.objects.filter(
        cluster__dedicated_tenant__isnull=True, state__in=["Running", "Recovering"]
    ):
        job_cancel(actor=w.padmin, job=job)
    Node.objects.filter(cluster__dedicated_tenant__isnull=True).update(state=NodeState.READY)
    return {}


def _paused(w):
    return {"id": _paused_rollout(w)["id"]}


def _idle(w):
    return {"id": w.idle_node().pk}


def _ids(**kinds):
    """A prepare that reads ids of the world: ``_ids(id=("job", "acme"))``."""
    return lambda w: {key: w.id(kind, owner) for key, (kind, owner) in kinds.items()}


path_id = lambda w, ctx: {"id": ctx["id"]}  # noqa: E731


def _settled_incident(w) -> dict:
    """The provider's incident, its recoveries ended (resolving waits for a running one)."""
    from jobs.models import RecoveryAction

    pk = w.id("incident", "provider")
    RecoveryAction.objects.filter(incident_id=pk, state__in=("planned", "running")).update(state="succeeded")
    return {"id": pk}


def _resolved_incident(w) -> dict:
    from jobs.models import Incident
    from jobs.services.incident_work import incident_resolve

    ctx = _settled_incident(w)
    incident_resolve(actor=w.padmin, incident=Incident.objects.get(pk=ctx["id"]), cause="unknown")
    return ctx


API_WRITES: dict[str, Write] = {
    "api_v1_agent_tokens_create": Write(
        "provider-admin",
        body=lambda w, ctx: {"cluster": w.id("cluster", "acme"), "name": "audit agents"},
        target=created("telemetry.agenttoken"),
        action="agent_token.create",
        status=201,
    ),
    "api_v1_agent_tokens_destroy": Write(
        "operator",
        prepare=_ids(id=("agent-token", "provider")),
        path=path_id,
        target=at("telemetry.agenttoken"),
        action="agent_token.revoke",
        status=204,
    ),
    "api_v1_agent_tokens_rotate_create": Write(
        "operator",
        prepare=_ids(id=("agent-token", "provider")),
        path=path_id,
        target=created("telemetry.agenttoken"),
        action="agent_token.create",
        status=201,
    ),
    "api_v1_launcher_credentials_create": Write(
        "operator",
        body=lambda w, ctx: {"cluster": w.id("cluster", "acme"), "name": "audit launcher"},
        target=created("jobs.launchercredential"),
        action="launcher_credential.create",
        status=201,
    ),
    "api_v1_launcher_credentials_destroy": Write(
        "provider-admin",
        prepare=lambda w: {"id": _launcher_credential(w)},
        path=path_id,
        target=at("jobs.launchercredential"),
        action="launcher_credential.revoke",
        status=204,
    ),
    "api_v1_automation_update": Write(
        "provider-admin",
        body=lambda w, ctx: {"mode": "dry-run", "reason": "audit"},
        target=lambda w, ctx, response: ("fleet.automationswitch", "1"),
        action="automation.switch",
    ),
    "api_v1_blueprints_create": Write(
        "operator",
        body=lambda w, ctx: {"name": "audit-blueprint"},
        target=created("fleet.blueprint"),
        action="blueprint.create",
        status=201,
    ),
    "api_v1_blueprints_partial_update": Write(
        "operator",
        prepare=lambda w: {"id": w.blueprint("gpu-base").pk},
        path=path_id,
        body=lambda w, ctx: {"description": "audited"},
        target=at("fleet.blueprint"),
        action="blueprint.update",
    ),
    "api_v1_blueprints_overlays_update": Write(
        "operator",
        prepare=lambda w: {"id": w.blueprint("gpu-base").pk},
        path=path_id,
        body=lambda w, ctx: {
            "overlays": [{"name": "eu", "labels": {"region": "eu"}, "addon": "a", "values": {}}]
        },
        target=at("fleet.blueprint"),
        action="blueprint.overlays_set",
    ),
    "api_v1_blueprints_source_update": Write(
        "operator",
        prepare=lambda w: {"id": w.blueprint("gpu-base").pk},
        path=path_id,
        body=lambda w, ctx: {"url": "https://git.example.org/fleet.git", "webhook_secret": "s" * 20},
        target=at("fleet.blueprint"),
        action="blueprint.source_set",
    ),
    "api_v1_blueprints_source_destroy": Write(
        "operator",
        prepare=lambda w: _with_source(w),
        path=path_id,
        target=at("fleet.blueprint"),
        action="blueprint.source_delete",
        status=204,
    ),
    "api_v1_blueprints_source_sync_create": Write(
        "operator",
        prepare=lambda w: _with_source(w),
        path=path_id,
        target=at("fleet.blueprint"),
        action="blueprint.source_poll",
        status=202,
    ),
    "api_v1_blueprints_versions_create": Write(
        "operator",
        prepare=lambda w: {"id": w.blueprint("gpu-base").pk},
        path=path_id,
        body=lambda w, ctx: {
            "addons": w.blueprint("gpu-base").versions.order_by("-number").first().addons,
            "notes": "audit draft",
        },
        target=lambda w, ctx, response: (
            "fleet.blueprintversion",
            str(w.blueprint("gpu-base").versions.get(number=response.json()["number"]).pk),
        ),
        action="blueprint.version_create",
        status=201,
    ),
    "api_v1_blueprints_versions_partial_update": Write(
        "operator",
        prepare=_draft,
        path=lambda w, ctx: {"id": ctx["id"], "number": ctx["number"]},
        body=lambda w, ctx: {"notes": "changed draft"},
        target=at("fleet.blueprintversion", "version"),
        action="blueprint.version_update",
    ),
    "api_v1_blueprints_versions_activate_create": Write(
        "operator",
        prepare=_draft,
        path=lambda w, ctx: {"id": ctx["id"], "number": ctx["number"]},
        target=at("fleet.blueprintversion", "version"),
        action="blueprint.version_activate",
    ),
    "api_v1_blueprints_versions_disable_create": Write(
        "operator",
        prepare=_active,
        path=lambda w, ctx: {"id": ctx["id"], "number": ctx["number"]},
        target=at("fleet.blueprintversion", "version"),
        action="blueprint.version_disable",
    ),
    "api_v1_blueprints_yaml_update": Write(
        "operator",
        prepare=_yaml_document,
        path=path_id,
        body=lambda w, ctx: ctx["document"],
        content_type="application/yaml",
        target=at("fleet.blueprint"),
        action="blueprint.update",
    ),
    "api_v1_clusters_create": Write(
        "operator",
        body=lambda w, ctx: {
            "fleet": w.cluster("provider").fleet_id,
            "name": "audit-cluster",
            "region": "eu",
            "kind": "kubernetes",
            "driver": "simulated",
        },
        target=created("fleet.cluster"),
        action="cluster.create",
        status=201,
    ),
    "api_v1_clusters_partial_update": Write(
        "operator",
        prepare=_ids(id=("cluster", "acme")),
        path=path_id,
        body=lambda w, ctx: {"labels": {"audit": "yes"}},
        target=at("fleet.cluster"),
        action="cluster.update",
    ),
    "api_v1_clusters_destroy": Write(
        "operator",
        prepare=_doomed_cluster,
        path=path_id,
        target=at("fleet.cluster"),
        action="cluster.delete",
        status=204,
    ),
    "api_v1_clusters_blueprint_update": Write(
        "operator",
        prepare=_ids(id=("cluster", "nimbus")),
        path=path_id,
        body=lambda w, ctx: {"blueprint": w.blueprint("gpu-resilient").pk, "version": 1, "reason": "audit"},
        target=at("fleet.cluster"),
        action="cluster.assign",
    ),
    "api_v1_clusters_reconcile_create": Write(
        "operator",
        prepare=_ids(id=("cluster", "provider")),
        path=path_id,
        target=at("fleet.cluster"),
        action="cluster.reconcile",
    ),
    "api_v1_drift_sweep_create": Write(
        "operator",
        target=lambda w, ctx, response: ("fleet.cluster", "*"),
        action="drift.sweep_requested",
        status=202,
    ),
    "api_v1_faults_create": Write(
        "operator",
        body=lambda w, ctx: {"node": w.idle_node().pk, "kind": "straggler"},
        target=created("jobs.faultevent"),
        action="fault.ingest",
        status=201,
    ),
    "api_v1_faults_repaired_create": Write(
        "operator",
        prepare=_failed_node_fault,
        path=path_id,
        target=at("fleet.node", "node"),
        action="node.repaired",
    ),
    "api_v1_fleets_create": Write(
        "operator",
        body=lambda w, ctx: {"name": "audit-fleet"},
        target=created("fleet.fleet"),
        action="fleet.create",
        status=201,
    ),
    "api_v1_fleets_partial_update": Write(
        "operator",
        prepare=_ids(id=("fleet", "acme")),
        path=path_id,
        body=lambda w, ctx: {"description": "audited"},
        target=at("fleet.fleet"),
        action="fleet.update",
    ),
    "api_v1_fleets_destroy": Write(
        "operator",
        prepare=_empty_fleet,
        path=path_id,
        target=at("fleet.fleet"),
        action="fleet.delete",
        status=204,
    ),
    "api_v1_ingest_alertmanager_create": Write(
        "operator",
        body=lambda w, ctx: webhook(w.idle_node().hostname),
        target=lambda w, ctx, response: ("jobs.faultevent", str(response.json()["alerts"][0]["fault"])),
        action="fault.ingest",
    ),
    "api_v1_jobs_create": Write(
        "acme-admin",
        body=lambda w, ctx: {"name": "audit-job", "cluster": w.id("cluster", "acme"), "gpus": 8},
        target=created("jobs.job"),
        action="job.submit",
        status=201,
    ),
    # The first report of each reporter per job an hour, and any that moves the job back (jobs.services.jobs).
    "api_v1_jobs_progress_create": Write(
        "acme-admin",
        prepare=_ids(id=("job", "acme")),
        path=path_id,
        body=lambda w, ctx: {"iteration": 10},
        target=at("jobs.job"),
        action="job.progress",
    ),
    "api_v1_incidents_acknowledge_create": Write(
        "operator",
        prepare=_ids(id=("incident", "provider")),
        path=path_id,
        target=at("jobs.incident"),
        action="incident.acknowledge",
    ),
    "api_v1_incidents_assign_create": Write(
        "operator",
        prepare=_ids(id=("incident", "provider")),
        path=path_id,
        body=lambda w, ctx: {"user": w.user("operator").pk},
        target=at("jobs.incident"),
        action="incident.assign",
    ),
    "api_v1_incidents_notes_create": Write(
        "acme-admin",
        prepare=_ids(id=("incident", "acme")),
        path=path_id,
        body=lambda w, ctx: {"body": "seen from **acme**"},
        target=at("jobs.incident"),
        action="incident.note",
        status=201,
    ),
    "api_v1_incidents_resolve_create": Write(
        "operator",
        prepare=_settled_incident,
        path=path_id,
        body=lambda w, ctx: {"cause": "hardware"},
        target=at("jobs.incident"),
        action="incident.resolve",
    ),
    "api_v1_incidents_reopen_create": Write(
        "operator",
        prepare=_resolved_incident,
        path=path_id,
        target=at("jobs.incident"),
        action="incident.reopen",
    ),
    "api_v1_jobs_cancel_create": Write(
        "acme-admin",
        prepare=_ids(id=("job", "acme")),
        path=path_id,
        target=at("jobs.job"),
        action="job.cancel",
    ),
    "api_v1_jobs_snapshots_create": Write(
        "operator",
        prepare=_protected_job,
        path=path_id,
        target=at("jobs.job"),
        action="job.snapshot",
        status=201,
    ),
    "api_v1_nodes_partial_update": Write(
        "operator",
        prepare=_idle,
        path=path_id,
        body=lambda w, ctx: {
            "taints": [{"key": "lockstep.io/audit", "value": "yes", "effect": "NoSchedule"}]
        },
        target=at("fleet.node"),
        action="node.taint",
    ),
    "api_v1_nodes_cordon_create": Write(
        "operator",
        prepare=_idle,
        path=path_id,
        body=lambda w, ctx: {"reason": "audit"},
        target=at("fleet.node"),
        action="node.cordon",
    ),
    "api_v1_nodes_drain_create": Write(
        "operator", prepare=_idle, path=path_id, target=at("fleet.node"), action="node.drain"
    ),
    "api_v1_nodes_uncordon_create": Write(
        "operator", prepare=_cordoned, path=path_id, target=at("fleet.node"), action="node.uncordon"
    ),
    "api_v1_notification_channels_create": Write(
        "provider-admin",
        body=lambda w, ctx: {"name": "audit-hook", "url": "https://hooks.example/audit"},
        target=created("telemetry.notificationchannel"),
        action="notification_channel.create",
        status=201,
    ),
    "api_v1_notification_channels_partial_update": Write(
        "provider-admin",
        prepare=_ids(id=("notification-channel", "provider")),
        path=path_id,
        body=lambda w, ctx: {"enabled": False},
        target=at("telemetry.notificationchannel"),
        action="notification_channel.update",
    ),
    "api_v1_notification_channels_destroy": Write(
        "provider-admin",
        prepare=_ids(id=("notification-channel", "provider")),
        path=path_id,
        target=at("telemetry.notificationchannel"),
        action="notification_channel.delete",
        status=204,
    ),
    "api_v1_rollouts_create": Write(
        "operator",
        prepare=_new_resilient_version,
        body=lambda w, ctx: {
            "blueprint": ctx["blueprint"],
            "version": ctx["number"],
            "targets": {"clusters": [w.id("cluster", "nimbus")]},
        },
        target=created("fleet.rollout"),
        action="rollout.start",
        status=201,
    ),
    "api_v1_rollouts_cancel_create": Write(
        "operator",
        prepare=_ids(id=("rollout", "provider")),
        path=path_id,
        target=at("fleet.rollout"),
        action="rollout.cancel",
    ),
    "api_v1_rollouts_pause_create": Write(
        "operator",
        prepare=_ids(id=("rollout", "provider")),
        path=path_id,
        target=at("fleet.rollout"),
        action="rollout.pause",
    ),
    "api_v1_rollouts_resume_create": Write(
        "operator", prepare=_paused_rollout, path=path_id, target=at("fleet.rollout"), action="rollout.resume"
    ),
    "api_v1_rollouts_rollback_create": Write(
        "operator", prepare=_paused, path=path_id, target=at("fleet.rollout"), action="rollout.rollback"
    ),
    "api_v1_tenants_create": Write(
        "provider-admin",
        body=lambda w, ctx: {"name": "Audit Co", "slug": "audit-co"},
        target=created("tenancy.tenant"),
        action="tenant.create",
        status=201,
    ),
    "api_v1_tenants_partial_update": Write(
        "provider-admin",
        prepare=_ids(id=("tenant", "acme")),
        path=path_id,
        body=lambda w, ctx: {"tier": "resilient"},
        target=at("tenancy.tenant"),
        action="tenant.update",
    ),
    "api_v1_tokens_create": Write(
        "acme-admin",
        body=lambda w, ctx: {"name": "audit-token", "scope": "read"},
        target=created("tenancy.apitoken"),
        action="token.create",
        status=201,
    ),
    "api_v1_tokens_destroy": Write(
        "acme-admin",
        prepare=_ids(id=("token", "acme")),
        path=path_id,
        target=at("tenancy.apitoken"),
        action="token.revoke",
        status=204,
    ),
    "api_v1_users_create": Write(
        "acme-admin",
        body=lambda w, ctx: {
            "username": "audit-user",
            "role": "tenant-viewer",
            "tenant": w.id("tenant", "acme"),
        },
        target=created("auth.user"),
        action="user.create",
        status=201,
    ),
    "api_v1_users_destroy": Write(
        "acme-admin",
        prepare=_ids(id=("user", "acme")),
        path=path_id,
        target=at("auth.user"),
        action="user.deactivate",
        status=204,
    ),
    "api_v1_users_role_create": Write(
        "acme-admin",
        prepare=_ids(id=("user", "acme")),
        path=path_id,
        body=lambda w, ctx: {"role": "tenant-admin"},
        target=at("auth.user"),
        action="user.role",
    ),
    "api_v1_users_reset_password_create": Write(
        "acme-admin",
        prepare=_ids(id=("user", "acme")),
        path=path_id,
        target=at("auth.user"),
        action="user.password-reset",
    ),
    "api_v1_whatif_create": Write(
        "operator",
        body=lambda w, ctx: {"seed": 3, "days": 1},
        target=created("simulator.whatifrun"),
        action="whatif.start",
        status=202,
    ),
}


def _latest(model: str):
    def target(w, ctx, response):
        from django.apps import apps

        return model, str(apps.get_model(model).objects.order_by("-pk").values_list("pk", flat=True).first())

    return target


CONFIRMED = {"confirmed": "yes"}  # the second POST of an action that asks first (controlplane/confirm.py)

PAGE_WRITES: dict[str, Write] = {
    "home": Write(
        "acme-admin",
        body=lambda w, ctx: {"name": "page-job", "cluster": w.id("cluster", "acme"), "gpus": "8"},
        target=_latest("jobs.job"),
        action="job.submit",
        status=302,
    ),
    "token-list": Write(
        "acme-viewer",
        body=lambda w, ctx: {"name": "page-token", "scope": "read"},
        target=_latest("tenancy.apitoken"),
        action="token.create",
    ),
    "token-revoke": Write(
        "acme-admin",
        prepare=_ids(pk=("token", "acme")),
        path=lambda w, ctx: {"pk": ctx["pk"]},
        body=lambda w, ctx: CONFIRMED,
        target=at("tenancy.apitoken", "pk"),
        action="token.revoke",
        status=302,
    ),
    "whatif-list-page": Write(
        "operator",
        body=lambda w, ctx: {"seed": "3", "days": "1"},
        target=_latest("simulator.whatifrun"),
        action="whatif.start",
        status=302,
    ),
    "scenario-list": Write(
        "operator",
        prepare=_room_for_scenario,
        target=_latest("simulator.scenario"),
        action="scenario.start",
        status=302,
    ),
    "fleet-cluster-reconcile": Write(
        "operator",
        prepare=_ids(pk=("cluster", "provider")),
        path=lambda w, ctx: {"pk": ctx["pk"]},
        target=at("fleet.cluster", "pk"),
        action="cluster.reconcile",
        status=302,
    ),
    "fleet-rollout-action": Write(
        "operator",
        prepare=_ids(pk=("rollout", "provider")),
        path=lambda w, ctx: {"pk": ctx["pk"], "action": "pause"},
        target=at("fleet.rollout", "pk"),
        action="rollout.pause",
        status=302,
    ),
    # The write actions' pages (issue 24); the destructive ones are sent confirmed.
    "fleet-version-new": Write(
        "operator",
        prepare=lambda w: {"pk": w.blueprint("gpu-base").pk},
        path=lambda w, ctx: {"pk": ctx["pk"]},
        body=lambda w, ctx: {
            "parent": "",
            "notes": "audit page draft",
            "create": "1",
            "content": yaml.safe_dump(
                {"addons": w.blueprint("gpu-base").versions.order_by("-number").first().addons}
            ),
        },
        target=_latest("fleet.blueprintversion"),
        action="blueprint.version_create",
        status=302,
    ),
    "fleet-version-activate": Write(
        "operator",
        prepare=_draft,
        path=lambda w, ctx: {"pk": ctx["id"], "number": ctx["number"]},
        body=lambda w, ctx: CONFIRMED,
        target=at("fleet.blueprintversion", "version"),
        action="blueprint.version_activate",
        status=302,
    ),
    "fleet-blueprint-import": Write(
        "operator",
        prepare=_yaml_document,
        body=lambda w, ctx: {"document": ctx["document"], "apply": "1"},
        target=at("fleet.blueprint"),
        action="blueprint.update",
        status=302,
    ),
    "fleet-rollout-new": Write(
        "operator",
        prepare=_new_resilient_version,
        body=lambda w, ctx: {
            "version": f"{ctx['blueprint']}:{ctx['number']}",
            "target_kind": "clusters",
            "clusters": [w.id("cluster", "nimbus")],
            "canary": "0",
            "batch_percent": "25",
            "max_failures": "0",
            "soak_seconds": "60",
            "progress_deadline_seconds": "600",
            "auto_rollback": "on",
            "plan": str(w.id("cluster", "nimbus")),
            "start": "1",
        },
        target=_latest("fleet.rollout"),
        action="rollout.start",
        status=302,
    ),
    "fleet-cluster-assign": Write(
        "operator",
        prepare=_ids(pk=("cluster", "nimbus")),
        path=lambda w, ctx: {"pk": ctx["pk"]},
        body=lambda w, ctx: {
            "assignment": f"pin:{w.blueprint('gpu-resilient').pk}:1",
            "reason": "audit",
            **CONFIRMED,
        },
        target=at("fleet.cluster", "pk"),
        action="cluster.assign",
        status=302,
    ),
    "fleet-node-action": Write(
        "operator",
        prepare=lambda w: {"pk": w.idle_node().pk},
        path=lambda w, ctx: {"pk": ctx["pk"], "action": "cordon"},
        body=lambda w, ctx: {"reason": "audit", **CONFIRMED},
        target=at("fleet.node", "pk"),
        action="node.cordon",
        status=302,
    ),
    "fleet-drift-sweep": Write(
        "operator", target=lambda w, ctx, response: ("fleet.cluster", "*"), action="drift.sweep", status=302
    ),
    "fleet-automation": Write(
        "provider-admin",
        body=lambda w, ctx: {"mode": "dry-run", "reason": "audit", **CONFIRMED},
        target=lambda w, ctx, response: ("fleet.automationswitch", "1"),
        action="automation.switch",
        status=302,
    ),
    "incident-act": Write(
        "operator",
        prepare=_ids(pk=("incident", "provider")),
        path=lambda w, ctx: {"pk": ctx["pk"], "action": "acknowledge"},
        target=at("jobs.incident", "pk"),
        action="incident.acknowledge",
        status=302,
    ),
    "job-cancel": Write(
        "acme-admin",
        prepare=_ids(pk=("job", "acme")),
        path=lambda w, ctx: {"pk": ctx["pk"]},
        body=lambda w, ctx: CONFIRMED,
        target=at("jobs.job", "pk"),
        action="job.cancel",
        status=302,
    ),
    "user-list": Write(
        "acme-admin",
        body=lambda w, ctx: {"username": "audit-page-user", "role": "tenant-viewer"},
        target=_latest("auth.user"),
        action="user.create",
    ),
    "user-role": Write(
        "acme-admin",
        prepare=_ids(pk=("user", "acme")),
        path=lambda w, ctx: {"pk": ctx["pk"]},
        body=lambda w, ctx: {"role": "tenant-admin"},
        target=at("auth.user", "pk"),
        action="user.role",
        status=302,
    ),
    "user-password-reset": Write(
        "acme-admin",
        prepare=_ids(pk=("user", "acme")),
        path=lambda w, ctx: {"pk": ctx["pk"]},
        body=lambda w, ctx: CONFIRMED,
        target=at("auth.user", "pk"),
        action="user.password-reset",
    ),
    "user-remove": Write(
        "acme-admin",
        prepare=_ids(pk=("user", "acme")),
        path=lambda w, ctx: {"pk": ctx["pk"]},
        body=lambda w, ctx: CONFIRMED,
        target=at("auth.user", "pk"),
        action="user.deactivate",
        status=302,
    ),
}

WRITES = schema_writes()
PAGES = form_pages()


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        try:
            built = World(matrix_world_build())
        except BaseException:
            call_command("flush", interactive=False, verbosity=0)
            raise
    yield built
    with django_db_blocker.unblock():
        call_command("flush", interactive=False, verbosity=0)


def test_every_write_is_covered(capsys):
    operations, pages = set(WRITES), PAGES
    assert operations - set(EXEMPT) == set(API_WRITES), (
        f"write operations without an audit spec: {sorted(operations - set(API_WRITES) - set(EXEMPT))}; "
        f"specs of no operation: {sorted(set(API_WRITES) - operations)}"
    )
    assert pages - set(EXEMPT) == set(PAGE_WRITES), (
        f"form pages: {sorted(pages)}; specs: {sorted(PAGE_WRITES)}"
    )
    with capsys.disabled():
        print(
            f"\naudit coverage: {len(operations)} write operations in the schema ({len(API_WRITES)} audited, "
            f"{len(operations & set(EXEMPT))} exempt), {len(pages)} form pages ({len(PAGE_WRITES)} audited)"
        )


def check(world: World, spec: Write, send: Callable) -> None:
    """Do the write in a transaction that is rolled back; the entries it left must name actor, action, object."""
    user = world.user(spec.role)
    with transaction.atomic():
        ctx = spec.prepare(world)
        before = AuditEntry.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        response = send(user, ctx)
        assert response.status_code == spec.status, response.content[:400]
        expected = spec.target(world, ctx, response)
        entries = list(
            AuditEntry.objects.filter(pk__gt=before).values(
                "actor_id", "actor_name", "action", "object_type", "object_id", "source"
            )
        )
        transaction.set_rollback(True)
    named = [e for e in entries if (e["object_type"], e["object_id"]) == expected]
    assert named, f"no audit entry names {expected}; the write left {entries}"
    entry = next((e for e in named if e["action"] == spec.action), named[0])
    assert (entry["actor_id"], entry["actor_name"], entry["action"]) == (
        user.pk,
        user.get_username(),
        spec.action,
    ), entry


@pytest.mark.parametrize("operation", sorted(API_WRITES))
def test_api_write_leaves_an_audit_entry(operation, world):
    from django.urls import resolve

    spec = API_WRITES[operation]
    method, template = WRITES[operation]
    token = world.built.tokens[spec.role]

    def send(user, ctx):
        path = template.format(**spec.path(world, ctx))
        assert resolve(path)
        body = spec.body(world, ctx)
        data = body if isinstance(body, str) else json.dumps(body)
        return getattr(Client(), method.lower())(
            path, data=data, content_type=spec.content_type, HTTP_AUTHORIZATION=f"Bearer {token}"
        )

    check(world, spec, send)


@pytest.mark.parametrize("page", sorted(PAGE_WRITES))
def test_form_page_write_leaves_an_audit_entry(page, world):
    from django.urls import reverse

    spec = PAGE_WRITES[page]

    def send(user, ctx):
        client = Client()
        client.force_login(user)
        return client.post(reverse(page, kwargs=spec.path(world, ctx)), spec.body(world, ctx))

    check(world, spec, send)
