"""Settling expected savings: a proactive move books an expected saving until its prediction is settled, then
realized if the node it left failed within the prediction horizon, and zero if it did not (docs/gpu-hours.md)."""

from datetime import timedelta

from django.conf import settings
from django.db.models import Q

from controlplane.audit import audit_entry, audit_record_many
from controlplane.bulk import update_rows
from jobs.choices import ActionKind, ActionState, FaultKind, SavingState
from jobs.models import FaultEvent, RecoveryAction

# The reports that mean a node really failed: it went away, or triage took a GPU or the node out of service.
FAILED = Q(kind=FaultKind.NODE_UNREACHABLE) | Q(triage__out_of_service=True)


def savings_settle(*, now) -> int:
    """Settle the expected savings whose outcome is known: the node failed within the horizon (realized: the
    saving booked at completion), or the horizon passed without a failure (nothing saved). The horizon is the
    prediction's own (its fault's ``details.horizon_hours``: scaled to a simulated cluster's time compression),
    else PREDICTION_HORIZON_HOURS. Returns how many."""
    # Most beats find none: the ids first (the partial index's few rows), the rows with their job and fault only
    # for those there are.
    ids = list(
        RecoveryAction.objects.filter(
            kind=ActionKind.PROACTIVE_MIGRATION, state=ActionState.SUCCEEDED, saving=SavingState.EXPECTED
        )
        .order_by("pk")
        .values_list("pk", flat=True)[:500]
    )
    if not ids:
        return 0
    pending = list(RecoveryAction.objects.filter(pk__in=ids).select_related("job", "fault").order_by("pk"))
    settled = []
    for action in pending:
        end = action.detected_at + timedelta(hours=_horizon_hours(action))
        failed = FaultEvent.objects.filter(
            FAILED,
            node_id=action.node_id,
            detected_at__gte=action.detected_at,
            detected_at__lte=min(end, now),
        ).exists()
        if failed:
            action.saving, action.gpu_hours_saved = (
                SavingState.REALIZED,
                action.gpu_hours_baseline - action.gpu_hours_lost,
            )
        elif now >= end:
            action.saving, action.gpu_hours_saved = SavingState.NOT_REALIZED, 0.0
        else:
            continue
        settled.append(action)
    update_rows(settled, ["saving", "gpu_hours_saved"])
    audit_record_many(
        [
            audit_entry(
                actor=None,
                action="recovery.settle",
                target=action,
                tenant_id=action.job.tenant_id,
                changes={"saving": action.saving, "gpu_hours_saved": round(action.gpu_hours_saved, 4)},
            )
            for action in settled
        ]
    )
    return len(settled)


def _horizon_hours(action: RecoveryAction) -> float:
    hours = ((action.fault.details or {}) if action.fault_id else {}).get("horizon_hours")
    try:
        hours = float(hours)
    except (TypeError, ValueError):
        return float(settings.PREDICTION_HORIZON_HOURS)
    return hours if 0 < hours < 24 * 365 else float(settings.PREDICTION_HORIZON_HOURS)
