"""Drift detection and correction: observe every cluster, compare with its blueprint version, open and resolve
findings, and — where the blueprint says so — re-apply the desired state, giving up (and reporting) after
DRIFT_MAX_CORRECTIONS failed attempts.

Correction is automation: the cluster's effective automation mode (its own, its fleet's, the provider switch)
governs it. In dry-run the sweep records what it would re-apply (the finding's note, an audit entry and the
``drift.changed`` event) and changes nothing; paused, it holds (the finding's note says so). Detection runs in
every mode."""

from collections import defaultdict
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from controlplane.audit import audit_record
from controlplane.bulk import update_rows
from fleet.choices import AutomationMode, DriftMode
from fleet.desired import compare, desired_state, is_node_software, load_versions
from fleet.models import Cluster, DriftFinding
from fleet.models.hardware import provider_automation
from fleet.overlays import load_overlays, with_overlays
from fleet.services.applying import converge
from fleet.services.observation import observe, record
from fleet.services.publishing import batched, publish

SWEEP_LOCK = 0x4C53_4446  # "LSDF": one sweep at a time across workers


@dataclass
class SweepReport:
    clusters: int = 0
    checks: int = 0
    unreachable: list[int] = field(default_factory=list)
    opened: int = 0
    resolved: int = 0
    corrected: int = 0
    gave_up: int = 0
    would_correct: int = 0
    held: int = 0
    skipped: bool = False

    def as_dict(self) -> dict:
        return {k: (len(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()}


def drift_sweep_request(*, actor) -> None:
    """Queue a sweep of every cluster now (an operator asked: the audit trail says who)."""
    from fleet.tasks import drift_sweep_task

    audit_record(
        actor=actor,
        action="drift.sweep_requested",
        object_type="fleet.cluster",
        object_id="*",
        changes={"clusters": "all"},
    )
    drift_sweep_task.delay()


def drift_sweep_now(*, actor) -> SweepReport:
    """Sweep every cluster now, in the caller's request, and return what the sweep did (clusters observed,
    findings opened and resolved, corrections made, held or recorded as dry-run). Audited with those counts; a
    sweep already running elsewhere makes this one skip (``skipped``)."""
    report = drift_sweep()
    audit_record(
        actor=actor,
        action="drift.sweep",
        object_type="fleet.cluster",
        object_id="*",
        changes=report.as_dict(),
    )
    return report


def _sweep_lock() -> bool:
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [SWEEP_LOCK])
        return cursor.fetchone()[0]


def drift_sweep(*, cluster_ids: list[int] | None = None, now=None) -> SweepReport:
    """Observe, compare, record, open/resolve findings and correct, for every cluster that carries a version (or
    the given ones). Runs a fixed number of queries however many clusters there are, plus a few per cluster
    whose findings changed (its events) or that is corrected."""
    now = now or timezone.now()
    report = SweepReport()
    clusters = (
        Cluster.objects.filter(blueprint_version__isnull=False)
        .select_related("blueprint", "fleet")
        .only(
            "id",
            "name",
            "driver",
            "connection",
            "blueprint_version_id",
            "dedicated_tenant_id",
            "blueprint__drift_mode",
            "automation",
            "fleet__automation",
        )
    )
    if cluster_ids is not None:
        clusters = clusters.filter(pk__in=cluster_ids)
    clusters = list(clusters)
    observed, errors = observe(clusters)
    versions = load_versions({c.blueprint_version_id for c in clusters})
    desired_by_version = {vid: desired_state(v) for vid, v in versions.items()}
    overlays = load_overlays({v.blueprint_id for v in versions.values()})
    checks = {
        c.pk: compare(
            with_overlays(
                desired_by_version[c.blueprint_version_id],
                c,
                overlays.get(versions[c.blueprint_version_id].blueprint_id),
            ),
            observed[c.pk],
        )
        for c in clusters
        if c.pk in observed
    }
    report.clusters, report.unreachable = len(clusters), sorted(errors)
    report.checks = sum(len(found) for found in checks.values())
    with transaction.atomic(), batched():
        if not _sweep_lock():
            report.skipped = True
            return report
        record(checks, errors, now)
        changed = _findings(checks, now, report)
        correcting = [
            c
            for c in clusters
            if c.pk in checks
            and c.blueprint.drift_mode == DriftMode.CORRECT
            and any(check.kind for check in checks[c.pk])
        ]
        if correcting:
            provider = provider_automation()
            modes = {c.pk: c.automation_under(provider) for c in correcting}
            _correct(
                [c for c in correcting if modes[c.pk] == AutomationMode.ACTIVE], checks, now, report, changed
            )
            _hold(
                [c for c in correcting if modes[c.pk] != AutomationMode.ACTIVE],
                modes,
                checks,
                now,
                report,
                changed,
            )
        for cluster_id, summary in changed.items():
            publish(
                "drift.changed",
                {"cluster": cluster_id, **summary},
                f"/api/v1/drift/?cluster={cluster_id}",
                clusters=[cluster_id],
            )
    return report


def _findings(checks: dict, now, report: SweepReport) -> dict[int, dict]:
    """Open findings for new drift, refresh the ones still seen, resolve the ones gone. Returns per-cluster
    summaries of what changed."""
    open_rows = {
        (f.cluster_id, f.addon, f.kind): f
        for f in DriftFinding.objects.filter(cluster_id__in=list(checks), resolved_at__isnull=True)
    }
    current = {
        (cid, check.name, check.kind): check for cid, found in checks.items() for check in found if check.kind
    }
    changed: dict[int, dict] = defaultdict(lambda: {"opened": [], "resolved": []})
    new = [
        DriftFinding(
            cluster_id=key[0], addon=key[1], kind=key[2], diff=check.diff, detected_at=now, last_seen_at=now
        )
        for key, check in current.items()
        if key not in open_rows
    ]
    if new:
        DriftFinding.objects.bulk_create(new)
    for finding in new:
        changed[finding.cluster_id]["opened"].append(f"{finding.addon}: {finding.kind}")
    seen = [f.pk for key, f in open_rows.items() if key in current]
    if seen:
        DriftFinding.objects.filter(pk__in=seen).update(last_seen_at=now)
    moved = [f for key, f in open_rows.items() if key in current and f.diff != current[key].diff]
    for finding in moved:
        finding.diff = current[(finding.cluster_id, finding.addon, finding.kind)].diff
    if moved:
        update_rows(moved, ["diff"])
    gone = [f for key, f in open_rows.items() if key not in current]
    by_resolution = defaultdict(list)
    for finding in gone:
        how = (
            DriftFinding.Resolution.CORRECTED
            if finding.correction_attempts
            else DriftFinding.Resolution.CONVERGED
        )
        by_resolution[how].append(finding.pk)
        changed[finding.cluster_id]["resolved"].append(f"{finding.addon}: {finding.kind} ({how})")
    for how, ids in by_resolution.items():
        DriftFinding.objects.filter(pk__in=ids).update(resolved_at=now, resolution=how)
    report.opened, report.resolved = len(new), len(gone)
    return changed


def _correct(clusters: list[Cluster], checks: dict, now, report: SweepReport, changed: dict) -> None:
    """Re-apply desired state on clusters whose blueprint corrects drift; a finding whose corrections keep
    failing is reported once and left alone."""
    limit = settings.DRIFT_MAX_CORRECTIONS
    findings = defaultdict(dict)
    for finding in DriftFinding.objects.filter(cluster__in=clusters, resolved_at__isnull=True):
        findings[finding.cluster_id][finding.addon] = finding
    for cluster in clusters:
        mine = findings[cluster.pk]
        todo = [
            c
            for c in checks[cluster.pk]
            if c.kind and not is_node_software(c.name) and c.name in mine and mine[c.name].gave_up_at is None
        ]
        over = [c for c in todo if mine[c.name].correction_attempts >= limit]
        todo = [c for c in todo if c not in over]
        for check in over:
            finding = mine[check.name]
            finding.gave_up_at = now
            finding.save(update_fields=["gave_up_at"])
            report.gave_up += 1
            changed[cluster.pk].setdefault("gave_up", []).append(check.name)
            audit_record(
                actor=None,
                action="drift.correction_gave_up",
                target=finding,
                tenant_id=cluster.dedicated_tenant_id,
                changes={"attempts": finding.correction_attempts, "error": finding.last_correction_error},
            )
        if not todo:
            continue
        done, failed = converge(cluster=cluster, checks=todo)
        for check in todo:
            finding = mine[check.name]
            finding.correction_attempts += 1
            finding.last_correction_at = now
            finding.last_correction_error = failed.get(check.name, "")
            finding.save(update_fields=["correction_attempts", "last_correction_at", "last_correction_error"])
        report.corrected += len(done)
        changed[cluster.pk]["corrected"] = done
        if failed:
            changed[cluster.pk]["correction_failed"] = sorted(failed)
        audit_record(
            actor=None,
            action="drift.correct",
            target=cluster,
            tenant_id=cluster.dedicated_tenant_id,
            changes={"corrected": done, "failed": failed},
        )


def _hold(
    clusters: list[Cluster], modes: dict[int, str], checks: dict, now, report: SweepReport, changed: dict
) -> None:
    """Drift that automation would correct, on clusters in dry-run or paused: dry-run records what it would
    re-apply (the finding's note, audit, the event), paused notes that it holds. Nothing is re-applied."""
    findings = defaultdict(dict)
    for finding in DriftFinding.objects.filter(
        cluster__in=clusters, resolved_at__isnull=True, gave_up_at__isnull=True
    ):
        findings[finding.cluster_id][finding.addon] = finding
    for cluster in clusters:
        mine = findings[cluster.pk]
        todo = [
            c.name for c in checks[cluster.pk] if c.kind and not is_node_software(c.name) and c.name in mine
        ]
        if not todo:
            continue
        dry_run = modes[cluster.pk] == AutomationMode.DRY_RUN
        note = (
            "dry run: would re-apply the desired state"
            if dry_run
            else "held: automation is paused (provider-wide, or on the cluster or its fleet)"
        )
        notes = [mine[name] for name in todo if mine[name].last_correction_error != note]
        for finding in notes:
            finding.last_correction_error = note
        if notes:
            update_rows(notes, ["last_correction_error"])
        if dry_run:
            report.would_correct += len(todo)
            if notes:
                changed[cluster.pk]["would_correct"] = sorted(todo)
                audit_record(
                    actor=None,
                    action="drift.correct",
                    target=cluster,
                    tenant_id=cluster.dedicated_tenant_id,
                    changes={"dry_run": True, "would_correct": sorted(todo)},
                )
        else:
            report.held += len(todo)
            if notes:
                changed[cluster.pk]["held"] = sorted(todo)
