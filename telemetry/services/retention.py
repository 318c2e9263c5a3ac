"""Retention: raw samples, per-minute history, facility series and batch ids are pruned by beat, so the
database does not grow without bound (sizes per 1,000 GPUs per day: docs/telemetry.md)."""

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from telemetry.models import AlertRecord, FacilitySample, GPUSample, IngestBatch, NICSample, NodeMinute

CHUNK = 50_000


def _delete_in_chunks(queryset) -> int:
    """Delete in chunks so a large backlog never holds one huge transaction."""
    total = 0
    while True:
        ids = list(queryset.values_list("pk", flat=True)[:CHUNK])
        if not ids:
            return total
        with transaction.atomic():
            deleted, _ = queryset.model.objects.filter(pk__in=ids).delete()
        total += deleted


def telemetry_prune(*, now=None) -> dict:
    """Delete what is older than its retention period; returns the count per kind."""
    now = now or timezone.now()
    raw_cutoff = now - timedelta(hours=settings.TELEMETRY_RAW_RETENTION_HOURS)
    history_cutoff = now - timedelta(days=settings.TELEMETRY_HISTORY_DAYS)
    return {
        "gpu_samples": _delete_in_chunks(GPUSample.objects.filter(ts__lt=raw_cutoff)),
        "nic_samples": _delete_in_chunks(NICSample.objects.filter(ts__lt=raw_cutoff)),
        "ingest_batches": _delete_in_chunks(IngestBatch.objects.filter(received_at__lt=raw_cutoff)),
        "node_minutes": _delete_in_chunks(NodeMinute.objects.filter(minute__lt=history_cutoff)),
        "facility_samples": _delete_in_chunks(FacilitySample.objects.filter(ts__lt=history_cutoff)),
        "alert_records": _delete_in_chunks(AlertRecord.objects.filter(received_at__lt=history_cutoff)),
    }
