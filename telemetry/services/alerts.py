"""Take in an Alertmanager webhook: each alert becomes (or joins) a FaultEvent, once per fingerprint."""

from django.db import DataError, IntegrityError, transaction
from django.utils import timezone

from controlplane.errors import ServiceError
from fleet.models import Node
from jobs.services.faults import fault_ingest
from telemetry.alertmanager import map_alert
from telemetry.models import AlertRecord

MAX_ALERTS = 1000


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
    without a zone, a value the database refuses) is skipped with its reason rather than refusing the whole
    group: Alertmanager would otherwise retry the group forever, and each alert is its own transaction, so the
    answer is always 200 with every alert's outcome. An alert that started before the raw-retention period is
    taken in with its detection time clamped to it (``detected_at_clamped_from`` in its details).
    """
    alerts = _check_shape(payload)
    outcomes = []
    for alert in alerts:
        mapped = map_alert(alert)
        if mapped.problem:
            outcomes.append({"fingerprint": mapped.fingerprint, "outcome": "skipped", "reason": mapped.problem})
            continue
        node = Node.objects.filter(hostname=mapped.hostname).select_related("cluster").first()
        if node is None:
            outcomes.append({"fingerprint": mapped.fingerprint, "outcome": "skipped",
                             "reason": f"unknown node {mapped.hostname!r}"})
            continue
        try:
            with transaction.atomic():   # one alert at a time: a refused one leaves no row behind
                outcomes.append(_apply(actor, mapped, node))
        except (ServiceError, DataError) as error:   # skipped with its reason; the rest of the group goes on
            reason = error.detail if isinstance(error, ServiceError) else "the database refused a value of this alert"
            outcomes.append({"fingerprint": mapped.fingerprint, "outcome": "skipped", "reason": reason})
    return {"alerts": outcomes}


def _apply(actor, mapped, node) -> dict:
    record = AlertRecord.objects.select_for_update().filter(fingerprint=mapped.fingerprint,
                                                            starts_at=mapped.starts_at).first()
    base = {"fingerprint": mapped.fingerprint}
    if mapped.status == "resolved":
        if record is None or record.resolved_at is not None:
            return {**base, "outcome": "duplicate" if record else "skipped",
                    **({} if record else {"reason": "resolved alert whose firing was never received"})}
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
    if mapped.nic_name and not node.nics.filter(name=mapped.nic_name).exists():
        mapped.nic_name = None
    if mapped.gpu_index is not None and not node.gpus.filter(index=mapped.gpu_index).exists():
        mapped.gpu_index = None
    fault, created = fault_ingest(
        source="alertmanager", kind=mapped.kind, node=node, gpu_index=mapped.gpu_index, nic_name=mapped.nic_name,
        xid=mapped.xid, detected_at=mapped.starts_at, actor=actor,
        details={"alertname": mapped.labels.get("alertname", ""), "fingerprint": mapped.fingerprint,
                 "summary": mapped.annotations.get("summary", "")[:300]},
    )
    try:
        with transaction.atomic():
            AlertRecord.objects.create(fingerprint=mapped.fingerprint, starts_at=mapped.starts_at,
                                       alertname=mapped.labels.get("alertname", "")[:200], fault=fault,
                                       status="firing", labels=mapped.labels)
    except IntegrityError:
        return {**base, "outcome": "duplicate", "fault": fault.pk}
    return {**base, "outcome": "opened" if created else "merged", "fault": fault.pk}
