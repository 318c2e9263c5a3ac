from datetime import timedelta

import pytest
from django.utils import timezone

from telemetry.models import GPUSample, IngestBatch, NodeMinute
from telemetry.services.retention import telemetry_prune
from tests.support.factories import make_cluster, make_node

pytestmark = pytest.mark.django_db


def test_prune_removes_only_what_is_past_retention(settings):
    settings.TELEMETRY_RAW_RETENTION_HOURS = 24
    settings.TELEMETRY_HISTORY_DAYS = 30
    node = make_node(make_cluster())
    now = timezone.now()
    gpu = node.gpus.first()
    GPUSample.objects.bulk_create(
        [GPUSample(ts=now - timedelta(hours=h), gpu_id=gpu.pk, temperature=50) for h in (1, 23, 25, 48)]
    )
    NodeMinute.objects.bulk_create(
        [NodeMinute(node=node, minute=now - timedelta(days=d)) for d in (1, 29, 31)]
    )
    import uuid

    IngestBatch.objects.create(
        batch_id=uuid.uuid4(), cluster=node.cluster, received_at=now - timedelta(hours=30)
    )
    IngestBatch.objects.create(batch_id=uuid.uuid4(), cluster=node.cluster, received_at=now)
    counts = telemetry_prune(now=now)
    assert counts["gpu_samples"] == 2 and counts["node_minutes"] == 1 and counts["ingest_batches"] == 1
    assert GPUSample.objects.count() == 2 and NodeMinute.objects.count() == 2
    assert telemetry_prune(now=now)["gpu_samples"] == 0
