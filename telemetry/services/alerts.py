"""Take in an Alertmanager webhook: each alert becomes (or joins) a FaultEvent, once per fingerprint."""

import logging

from django.db import DataError, IntegrityError, transaction
from django.utils import timezone

from controlplane.errors import ServiceError
from fleet.models import Node
from jobs.services.faults import FaultReport, fault_ingest, fault_ingest_many
from telemetry.alertmanager import map_alert
from telemetry.models import AlertRecord

log = logging.getLogger(__name__)

MAX_ALERTS = 1000
# What the database says of one alert's values (a constraint, a range): that alert is skipped, not the group.
REFUSED = (ServiceError, DataError, IntegrityError)


def _check_shape(payload) -> list[dict]:
    if not isinstance(payload, dict):
        raise ServiceError("the body must be an Alertmanager webhook object")
    if str(payload.get("version")) != "4":
        raise ServiceError("only webhook payload version 4 is understood", field="version")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list) or not all(isinstance(a, dict) for a in alerts):
        raise ServiceError("a list of alert objects is required", field="alerts")
    if len(alerts) > MAX_ALERTS:
        raise ServiceError(f"at most {MAX_ALERTS} alerts per request", field="alerts")
    return alerts


def alertmanager_ingest(*, actor, payload) -> dict:
    """Returns, per alert, what happened: ``opened``, ``merged``, ``duplicate``, ``resolved`` or ``skipped``.

    An alert Lockstep cannot place or read (unknown node, no fault kind, labels that are not an object, a time
    without a zone, an Xid code out of range, a value the database refuses) is skipped with its reason rather than
    refusing the whole group: Alertmanager would otherwise retry the group forever. Each alert is its own
    transaction (a savepoint inside a caller's), so a refused one leaves nothing behind and no transaction
    aborted, and the answer is 200 with every alert's outcome; each skip is also logged with its reason. An alert
    that started before the raw-retention period is taken in with its detection time clamped to it
    (``detected_at_clamped_from`` in its details).
    """
    alerts = _check_shape(payload)
    mapped_alerts = [map_alert(alert) for alert in alerts]
    hostnames = {m.hostname for m in mapped_alerts if not m.problem}
    nodes: dict[str, Node] = {}
    for node in Node.objects.filter(hostname__in=hostnames).select_related("cluster").order_by("-pk"):
        nodes[node.hostname] = node  # the first by id, as .first() would take
    outcomes: list[dict | None] = []
    fresh = []  # (index in outcomes, mapped, node): firing alerts Lockstep has no record of
    recorded = _recorded([m for m in mapped_alerts if not m.problem and m.hostname in nodes])
    for mapped in mapped_alerts:
        if mapped.problem:
            outcomes.append(
                {"fingerprint": mapped.fingerprint, "outcome": "skipped", "reason": mapped.problem}
            )
        elif mapped.hostname not in nodes:
            outcomes.append(
                {
                    "fingerprint": mapped.fingerprint,
                    "outcome": "skipped",
                    "reason": f"unknown node {mapped.hostname!r}",
                }
            )
        elif mapped.status == "firing" and (mapped.fingerprint, mapped.starts_at) not in recorded:
            fresh.append((len(outcomes), mapped, nodes[mapped.hostname]))
            outcomes.append(None)
        else:
            outcomes.append(_apply_alone(actor, mapped, nodes[mapped.hostname]))
    if len(fresh) > 1:
        # A grouped notification (a leaf switch, a rack, 64 nodes at once): its new alerts are taken in together, one
        # statement a table, with the result taking them one by one gives; if any of them is refused, they are taken
        # one by one instead, so that a refused alert still skips alone.
        try:
            with transaction.atomic():
                for (index, _, _), outcome in zip(fresh, _apply_together(actor, fresh), strict=True):
                    outcomes[index] = outcome
            fresh = []
        except REFUSED:
            pass
    for index, mapped, node in fresh:
        outcomes[index] = _apply_alone(actor, mapped, node)
    for outcome in outcomes:
        if outcome["outcome"] == "skipped":
            log.warning("Alertmanager alert %r skipped: %s", outcome["fingerprint"], outcome["reason"])
    return {"alerts": outcomes}


def _recorded(mapped_alerts) -> set:
    """The (fingerprint, start) pairs of these alerts Lockstep already has a record of."""
    if not mapped_alerts:
        return set()
    rows = AlertRecord.objects.filter(
        fingerprint__in={m.fingerprint for m in mapped_alerts},
        starts_at__in={m.starts_at for m in mapped_alerts if m.starts_at is not None},
    )
    return set(rows.values_list("fingerprint", "starts_at"))


def _apply_alone(actor, mapped, node) -> dict:
    try:
        with transaction.atomic():  # one alert at a time: a refused one leaves no row behind
            return _apply(actor, mapped, node)
    except REFUSED as error:  # skipped with its reason; the rest of the group goes on
        if isinstance(error, ServiceError):
            reason = error.detail
        else:
            log.warning("Alertmanager alert %r refused by the database: %s", mapped.fingerprint, error)
            reason = "the database refused a value of this alert"
        return {"fingerprint": mapped.fingerprint, "outcome": "skipped", "reason": reason}


def _apply_together(actor, fresh) -> list[dict]:
    """``_apply`` for new firing alerts, all at once (in the caller's transaction; anything refused raises)."""
    for _, mapped, node in fresh:
        _known_devices(mapped, node)
    stored = fault_ingest_many(
        source="alertmanager",
        actor=actor,
        reports=[
            FaultReport(
                kind=mapped.kind,
                node=node,
                gpu_index=mapped.gpu_index,
                nic_name=mapped.nic_name,
                xid=mapped.xid,
                detected_at=mapped.starts_at,
                details=_details(mapped),
            )
            for _, mapped, node in fresh
        ],
    )
    AlertRecord.objects.bulk_create(
        [
            AlertRecord(
                fingerprint=mapped.fingerprint,
                starts_at=mapped.starts_at,
                alertname=mapped.labels.get("alertname", "")[:200],
                fault=fault,
                status="firing",
                labels=mapped.labels,
            )
            for (_, mapped, _), (fault, _) in zip(fresh, stored, strict=True)
        ]
    )
    return [
        {"fingerprint": mapped.fingerprint, "outcome": "opened" if created else "merged", "fault": fault.pk}
        for (_, mapped, _), (fault, created) in zip(fresh, stored, strict=True)
    ]


def _known_devices(mapped, node) -> None:
    """An alert's NIC or GPU that Lockstep does not know on the node is dropped (the fault is the node's)."""
    if mapped.nic_name and not node.nics.filter(name=mapped.nic_name).exists():
        mapped.nic_name = None
    if mapped.gpu_index is not None and not node.gpus.filter(index=mapped.gpu_index).exists():
        mapped.gpu_index = None


def _details(mapped) -> dict:
    return {
        "alertname": mapped.labels.get("alertname", ""),
        "fingerprint": mapped.fingerprint,
        "summary": mapped.annotations.get("summary", "")[:300],
    }


def _apply(actor, mapped, node) -> dict:
    record = (
        AlertRecord.objects.select_for_update()
        .filter(fingerprint=mapped.fingerprint, starts_at=mapped.starts_at)
        .first()
    )
    base = {"fingerprint": mapped.fingerprint}
    if mapped.status == "resolved":
        if record is None or record.resolved_at is not None:
            return {
                **base,
                "outcome": "duplicate" if record else "skipped",
                **({} if record else {"reason": "resolved alert whose firing was never received"}),
            }
        record.status = "resolved"
        record.resolved_at = mapped.ends_at or timezone.now()
        record.save(update_fields=["status", "resolved_at"])
        if record.fault_id:
            fault = record.fault
            fault.details = {**fault.details, "alert_resolved_at": record.resolved_at.isoformat()}
            fault.save(update_fields=["details"])
        return {**base, "outcome": "resolved", "fault": record.fault_id}
    if record is not None:
        return {**base, "outcome": "duplicate", "fault": record.fault_id}
    _known_devices(mapped, node)
    fault, created = fault_ingest(
        source="alertmanager",
        kind=mapped.kind,
        node=node,
        gpu_index=mapped.gpu_index,
        nic_name=mapped.nic_name,
        xid=mapped.xid,
        detected_at=mapped.starts_at,
        actor=actor,
        details=_details(mapped),
    )
    try:
        with transaction.atomic():
            AlertRecord.objects.create(
                fingerprint=mapped.fingerprint,
                starts_at=mapped.starts_at,
                alertname=mapped.labels.get("alertname", "")[:200],
                fault=fault,
                status="firing",
                labels=mapped.labels,
            )
    except IntegrityError:
        return {**base, "outcome": "duplicate", "fault": fault.pk}
    return {**base, "outcome": "opened" if created else "merged", "fault": fault.pk}
