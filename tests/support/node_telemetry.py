"""A node's telemetry history written through the real ingest service, as its agent would have sent it: one
reading per GPU and NIC every ``every`` seconds over the last ``minutes``, in batches of ten minutes; and a node
with such a history, an Xid and the recovery it got."""

import json
import math
import time
from datetime import timedelta

from django.utils import timezone

from telemetry.services.ingest import telemetry_ingest
from tests.support.factories import make_node
from tests.support.incidents import make_action, make_incident
from tests.support.telemetry import batch, nic, reading

GIB = 2**30


def seed_node_history(cluster, node, *, minutes: int, every: float = 10.0, end: float | None = None) -> int:
    """Ingest ``minutes`` of readings for every GPU and NIC of ``node`` ending at ``end`` (now); returns the
    number of GPU readings. Temperature, power and utilisation follow a slow wave per GPU; ECC counts climb."""
    end = end or time.time() - 1
    steps = int(minutes * 60 / every)
    gpus = list(node.gpus.order_by("index").values_list("index", flat=True))
    nics = list(node.nics.order_by("rail").values_list("name", flat=True))
    chunk = max(1, int(600 / every))
    for first in range(0, steps, chunk):
        readings, links = [], []
        for step in range(first, min(steps, first + chunk)):
            ts = end - (steps - 1 - step) * every
            wave = math.sin(step / 60)
            readings += [
                reading(
                    gpu,
                    ts,
                    DCGM_FI_DEV_GPU_TEMP=60.0 + 10 * wave + gpu,
                    DCGM_FI_DEV_POWER_USAGE=500.0 + 100 * wave,
                    DCGM_FI_DEV_GPU_UTIL=80.0 + 15 * wave,
                    DCGM_FI_DEV_ECC_SBE_VOL_TOTAL=step // 100,
                    DCGM_FI_DEV_FB_USED=60 * GIB,
                    DCGM_FI_DEV_FB_TOTAL=80 * GIB,
                )
                for gpu in gpus
            ]
            links += [
                nic(
                    name, ts, rx_bytes=step * 10**9, tx_bytes=step * 9 * 10**8, rx_errors=0, carrier_changes=2
                )
                for name in nics
            ]
        body = json.dumps(batch(node.hostname, readings=readings, nics=links)).encode()
        telemetry_ingest(cluster=cluster, body=body)
    return steps * len(gpus)


def node_with_an_xid(cluster, hostname: str, *, gpus: int, nics: int, minutes: int, xid_gpu: int):
    """A node of ``cluster`` with ``minutes`` of telemetry (a reading every 30 s), an Xid 79 on GPU ``xid_gpu``
    20 minutes ago (an incident) and the GPU reset it got (a recovery action of no job: provider roles see it)."""
    node = make_node(cluster, hostname, gpus=gpus, nics=nics)
    seed_node_history(cluster, node, minutes=minutes, every=30)
    incident = make_incident(
        node,
        reports=[{"kind": "gpu_xid", "xid": 79, "gpu_index": xid_gpu}],
        at=timezone.now() - timedelta(minutes=20),
    )
    make_action(incident, None, kind="gpu_reset", gpu_index=xid_gpu)
    return node
