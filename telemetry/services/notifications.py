"""Outgoing notifications: what a human must see, sent to webhooks (generic JSON or Slack-compatible).

The dispatcher reads the ``fleet`` topic of the event outbox after a cursor (so nothing is missed when a
worker dies: the cursor only moves in the transaction that writes the deliveries), matches RULES, and writes
one delivery per channel and event (unique: dispatching twice writes nothing new). The deliverer posts due
deliveries and schedules retries with back-off in the row; after MAX_ATTEMPTS a delivery is failed and stays
in the log.
"""

import logging
from datetime import timedelta

import requests
from django.db import transaction
from django.utils import timezone

from controlplane.events import topic
from controlplane.models import Event
from controlplane.outbound import OutboundRefused, outbound_post
from telemetry.models import NotificationChannel, NotificationCursor, NotificationDelivery

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
TIMEOUT_SECONDS = 5.0
BATCH = 500


def _automation_paused(kind: str, payload: dict) -> bool:
    if kind == "automation.updated":  # the provider-wide switch
        return payload.get("mode") == "paused"
    if kind not in ("fleet.updated", "cluster.updated") or "automation" not in payload.get("fields", []):
        return False
    from fleet.models import Cluster, Fleet

    model, key = (Fleet, "fleet") if kind == "fleet.updated" else (Cluster, "cluster")
    return model.objects.filter(pk=payload.get(key), automation="paused").exists()


# rule name -> (predicate on an event's kind and payload, one line for a human)
RULES = {
    # A job's failed attempt is followed by the next (jobs.services.fallback): what a human must hear is that the
    # job's recovery gave up. Node-level steps of the ladder have no next attempt.
    "recovery_failed": (
        lambda kind, p: kind == "action.failed" and not p.get("job"),
        lambda p: f"Recovery failed: {p.get('summary', '')} (node {p.get('node')}). {p.get('reason', '')}",
    ),
    "job_failed": (
        lambda kind, p: kind == "job.state" and p.get("state") == "Failed",
        lambda p: f"Job {p.get('name', '')} ({p.get('job')}) failed: {p.get('reason', 'recovery gave up')}",
    ),
    "needs_human": (
        lambda kind, p: kind in ("node.escalation", "fault.reported") and bool(p.get("needs_human")),
        lambda p: (
            f"Needs a human (CONTACT_SUPPORT or no automatic remedy): node {p.get('hostname') or p.get('node')} "
            f"{p.get('stage', '')} {p.get('kind', '')}".strip()
        ),
    ),
    "rollout_stopped": (
        lambda kind, p: (
            kind in ("rollout.failed", "rollout.rolledback", "rollout.paused", "cluster.rolled_back")
        ),
        lambda p: f"Rollout {p.get('rollout', '')} is {p.get('state', 'rolled back')}: {p.get('reason', '')}",
    ),
    # A drain still held up by jobs past DRAIN_DEADLINE_SECONDS (jobs.services.drain), once per drain.
    "drain_overdue": (
        lambda kind, p: kind == "node.drain_overdue",
        lambda p: (
            f"Drain of {p.get('hostname', '')} overdue: draining since {p.get('since', '')}, "
            f"still waits for {p.get('waits', '')}"
        ),
    ),
    "cluster_unreachable": (
        lambda kind, p: kind == "cluster.unreachable",
        lambda p: f"Cluster {p.get('name', '')} unreachable: {p.get('summary', '')}",
    ),
    "automation_paused": (_automation_paused, lambda p: f"Recovery automation paused on {p.get('name', '')}"),
    # A person worked an incident (jobs.services.incident_work): acknowledged, assigned, noted, resolved, reopened.
    "incident_worked": (
        lambda kind, p: kind.startswith("incident.") and bool(p.get("summary")),
        lambda p: p.get("summary", ""),
    ),
}


def notifications_dispatch() -> int:
    """Turn new fleet events into deliveries; returns how many deliveries were written."""
    written = 0
    with transaction.atomic():
        cursor, _ = NotificationCursor.objects.select_for_update().get_or_create(name="fleet")
        events = list(
            Event.objects.filter(topic=topic("fleet"), seq__gt=cursor.last_seq).order_by("seq")[:BATCH]
        )
        if not events:
            return 0
        channels = list(NotificationChannel.objects.filter(enabled=True))
        now = timezone.now()
        for event in events:
            for rule, (matches, describe) in RULES.items():
                if not matches(event.kind, event.payload):
                    continue
                summary = describe(event.payload)[:500]
                for channel in channels:
                    if channel.rules and rule not in channel.rules:
                        continue
                    _, created = NotificationDelivery.objects.get_or_create(
                        channel=channel,
                        event_id=event.pk,
                        defaults={
                            "rule": rule,
                            "summary": summary,
                            "next_attempt_at": now,
                            "payload": {
                                "rule": rule,
                                "summary": summary,
                                "kind": event.kind,
                                "topic": event.topic,
                                "seq": event.seq,
                                "url": event.url,
                                "created": event.created_at.isoformat(),
                                "payload": event.payload,
                            },
                        },
                    )
                    written += created
        cursor.last_seq = events[-1].seq
        cursor.save(update_fields=["last_seq"])
    return written


def _body(delivery: NotificationDelivery) -> dict:
    if delivery.channel.kind == NotificationChannel.Kind.SLACK:
        return {
            "text": f":rotating_light: Lockstep: {delivery.summary}",
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": f"*Lockstep* — {delivery.summary}"}}
            ],
        }
    return delivery.payload


def notifications_deliver(*, now=None) -> dict:
    """Post every due delivery once; returns counts of delivered, retried and failed."""
    now = now or timezone.now()
    counts = {"delivered": 0, "retry": 0, "failed": 0}
    due = NotificationDelivery.objects.filter(
        state=NotificationDelivery.State.PENDING, next_attempt_at__lte=now
    )
    for delivery_id in list(due.values_list("pk", flat=True)[:BATCH]):
        with transaction.atomic():
            delivery = (
                NotificationDelivery.objects.select_for_update(skip_locked=True)
                .select_related("channel")
                .filter(pk=delivery_id, state=NotificationDelivery.State.PENDING)
                .first()
            )
            if delivery is None:
                continue
            delivery.attempts += 1
            try:
                # Checked (the name resolved once) and sent to the address checked; a redirect is not followed.
                response = outbound_post(delivery.channel.url, json=_body(delivery), timeout=TIMEOUT_SECONDS)
            except OutboundRefused as refusal:
                ok, delivery.last_status, delivery.last_error = (
                    False,
                    None,
                    f"target refused: {refusal}"[:300],
                )
            except requests.RequestException as error:
                ok, delivery.last_status = False, None
                delivery.last_error = f"{type(error).__name__}: {error}"[:300]
            else:
                # The status only: what the receiver answered is not kept (an internal service's reply must not
                # reach whoever set the URL through the delivery log).
                delivery.last_status = response.status_code
                ok = 200 <= response.status_code < 300
                delivery.last_error = "" if ok else f"HTTP {response.status_code}"
            if ok:
                delivery.state, delivery.delivered_at = NotificationDelivery.State.DELIVERED, timezone.now()
                counts["delivered"] += 1
            elif delivery.attempts >= MAX_ATTEMPTS:
                delivery.state = NotificationDelivery.State.FAILED
                counts["failed"] += 1
                log.warning(
                    "notification %s to %s failed for good: %s",
                    delivery.pk,
                    delivery.channel,
                    delivery.last_error,
                )
            else:
                delivery.next_attempt_at = now + timedelta(
                    seconds=min(10 * 2 ** (delivery.attempts - 1), 3600)
                )
                counts["retry"] += 1
            delivery.save()
    return counts
