"""Telemetry ingest: one batch in one transaction, a fixed number of statements whatever its size.

Order of work: validate everything first (schema, clock skew, every node, GPU, rack the batch names — a
rejected batch stores nothing); record the batch id (a duplicate changes nothing); lock and load the previous
state of the GPUs and NICs it reports; fold the readings in time order (extract.py); write raw samples,
latest state with features, the per-minute history and facility series; hand hard faults to jobs'
``fault_ingest``, which stores them before anything acts on them.
"""

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from controlplane.errors import ServiceError
from fleet.models import Node
from jobs.services.faults import fault_ingest
from telemetry import extract
from telemetry.inventory import Inventory, inventory_for
from telemetry.models import FacilitySample, FacilityState, GPUSample, GPUState, IngestBatch, NICState
from telemetry.upsert import upsert
from telemetry.validation import parse_batch

GPU_STATE_COLUMNS = [
    "node_id", "ts", "fields", "temperature", "power", "utilization", "sbe_total", "dbe_total", "remapped_rows",
    "nvlink_errors", "nvlink_recovery_errors", "throttle_reasons", "recovery_action", "temperature_ewma",
    "temperature_slow", "temperature_trend", "sbe_rate", "remap_rate", "nvlink_rate", "throttle_share", "samples",
]
NIC_STATE_COLUMNS = [
    "node_id", "ts", "link_state", "fields", "link_downed", "symbol_errors", "link_error_recovery", "port_rcv_errors",
    "symbol_rate", "recovery_rate", "rcv_error_rate", "down_seconds", "flaps", "congestion_rate", "xmit_wait",
]


@dataclass
class IngestResult:
    batch_id: str
    duplicate: bool = False
    readings: int = 0
    nics: int = 0
    events: int = 0
    facility: int = 0
    faults: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"batch_id": self.batch_id, "duplicate": self.duplicate, "readings": self.readings, "nics": self.nics,
                "events": self.events, "facility": self.facility, "faults": self.faults}


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def _check_time(value: float, name: str, now: float, *, past: float) -> None:
    skew = settings.TELEMETRY_MAX_SKEW_SECONDS
    if value > now + skew:
        raise ServiceError(f"{value} is {value - now:.0f}s in the future (clock skew above {skew}s)", field=name)
    if value < now - past:
        raise ServiceError(f"{value} is older than {past:.0f}s", field=name)


def _resolve(batch: dict, inventory: Inventory, now: float) -> dict:
    """Map every reading to known rows, or raise naming the first field at fault. Nothing is written here."""
    _check_time(batch["sent_at"], "sent_at", now, past=settings.TELEMETRY_MAX_SKEW_SECONDS)
    oldest = settings.TELEMETRY_RAW_RETENTION_HOURS * 3600
    default_node = batch.get("node")
    resolved = {"readings": [], "nics": [], "events": [], "facility": []}
    for index, reading in enumerate(batch["readings"]):
        where = f"readings[{index}]"
        _check_time(reading["ts"], f"{where}.ts", now, past=oldest)
        node = inventory.node(reading.get("node") or default_node, f"{where}.node")
        gpu_id = node.gpus.get(reading["gpu"])
        if gpu_id is None:
            raise ServiceError(f"node {node.hostname} has no GPU {reading['gpu']}", field=f"{where}.gpu")
        resolved["readings"].append((reading["ts"], node, gpu_id, reading))
    for index, nic in enumerate(batch["nics"]):
        where = f"nics[{index}]"
        _check_time(nic["ts"], f"{where}.ts", now, past=oldest)
        node = inventory.node(nic.get("node") or default_node, f"{where}.node")
        nic_id = node.nics.get(nic["name"])
        if nic_id is not None:  # NICs Lockstep does not manage (a management port, say) are not an error
            resolved["nics"].append((nic["ts"], node, nic_id, nic))
    for index, event in enumerate(batch["events"]):
        where = f"events[{index}]"
        _check_time(event["ts"], f"{where}.ts", now, past=oldest)
        node = inventory.node(event.get("node") or default_node, f"{where}.node")
        gpu = event.get("gpu")
        if gpu is not None and gpu not in node.gpus:
            raise ServiceError(f"node {node.hostname} has no GPU {gpu}", field=f"{where}.gpu")
        resolved["events"].append((event["ts"], node, event))
    for index, sample in enumerate(batch["facility"]):
        where = f"facility[{index}]"
        _check_time(sample["ts"], f"{where}.ts", now, past=oldest)
        inventory.check_facility_target(sample["scope"], sample["target"], f"{where}.target")
        resolved["facility"].append(sample)
    return resolved


def telemetry_ingest(*, cluster, body: bytes) -> IngestResult:
    """Take in one batch for ``cluster`` (the agent token's). Raises ServiceError (400) on anything invalid."""
    batch = parse_batch(body)
    now = time.time()
    inventory = inventory_for(cluster.pk)
    resolved = _resolve(batch, inventory, now)
    result = IngestResult(batch_id=batch["batch_id"], readings=len(resolved["readings"]), nics=len(resolved["nics"]),
                          events=len(resolved["events"]), facility=len(resolved["facility"]))
    with transaction.atomic():
        try:
            with transaction.atomic():
                row = IngestBatch.objects.create(batch_id=batch["batch_id"], cluster_id=cluster.pk,
                                                 received_at=timezone.now(), readings=result.readings,
                                                 nics=result.nics, events=result.events, facility=result.facility)
        except IntegrityError:
            result.duplicate = True
            return result
        candidates: list[extract.FaultCandidate] = []
        candidates += _ingest_gpus(resolved["readings"])
        candidates += _ingest_nics(resolved["nics"])
        _ingest_facility(cluster.pk, resolved["facility"])
        for ts, node, event in resolved["events"]:
            candidates.append(extract.FaultCandidate("gpu_xid", node.id, ts, gpu_index=event.get("gpu"), xid=event["xid"],
                                                     details={"uuid": event.get("uuid", "")}))
        node_ids = {node.id for _, node, _, _ in resolved["readings"]} | {node.id for _, node, _, _ in resolved["nics"]}
        if node_ids:
            Node.objects.filter(pk__in=node_ids).update(last_seen_at=timezone.now())
        result.faults = _report_faults(candidates)
        if result.faults:
            IngestBatch.objects.filter(pk=row.pk).update(faults=len(result.faults))
    return result


def _ingest_gpus(readings: list) -> list[extract.FaultCandidate]:
    if not readings:
        return []
    readings.sort(key=lambda item: item[0])
    gpu_ids = {gpu_id for _, _, gpu_id, _ in readings}
    columns = [c for c in GPU_STATE_COLUMNS if c != "fields"]
    states: dict[int, dict] = {}
    for row in GPUState.objects.select_for_update().filter(gpu_id__in=gpu_ids).values("gpu_id", *columns):
        row["ts"] = row["ts"].timestamp()
        row["recovery_errors"] = row["nvlink_recovery_errors"]
        states[row["gpu_id"]] = row
    samples, faults, latest = [], [], {}
    limit = settings.TELEMETRY_THERMAL_CELSIUS
    for ts, node, gpu_id, reading in readings:
        fields = reading["fields"]
        samples.append((
            _dt(ts), gpu_id, fields.get("DCGM_FI_DEV_GPU_TEMP"), fields.get("DCGM_FI_DEV_POWER_USAGE"),
            fields.get("DCGM_FI_DEV_GPU_UTIL"), fields.get("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
            fields.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), extract.nvlink_total(fields),
            fields.get("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
        ))
        prev = states.get(gpu_id)
        if prev is not None and prev["ts"] is not None and ts <= prev["ts"]:
            continue  # an older reading (a spool replay) is history, not the latest state
        state, found = extract.gpu_step(prev, ts, fields, thermal_limit=limit)
        state.update(node_id=node.id, fields=fields, power=fields.get("DCGM_FI_DEV_POWER_USAGE"),
                     utilization=fields.get("DCGM_FI_DEV_GPU_UTIL"), recovery_action=reading.get("recovery_action", ""))
        states[gpu_id] = state
        latest[gpu_id] = state
        faults += [extract.FaultCandidate(kind, node.id, ts, gpu_index=reading["gpu"], details=details)
                   for kind, details in found]
    _write_samples(samples)
    for state in latest.values():
        state["ts"] = _dt(state["ts"])
        state["nvlink_recovery_errors"] = state.get("recovery_errors", 0)
        state["recovery_action"] = state.get("recovery_action") or ""
    upsert(GPUState, "gpu_id", GPU_STATE_COLUMNS, latest)
    _write_minutes(readings)
    return faults


SAMPLE_COLUMNS = ["ts", "gpu_id", "temperature", "power", "utilization", "sbe_total", "dbe_total", "nvlink_errors",
                  "throttle_reasons"]


def _write_samples(samples: list[tuple]) -> None:
    """Append raw samples: COPY on PostgreSQL, bulk_create elsewhere."""
    if connection.vendor != "postgresql":
        GPUSample.objects.bulk_create([GPUSample(**dict(zip(SAMPLE_COLUMNS, row, strict=True))) for row in samples],
                                      batch_size=2000)
        return
    with connection.cursor() as cursor:
        with cursor.connection.cursor().copy(
            f"COPY {GPUSample._meta.db_table} ({', '.join(SAMPLE_COLUMNS)}) FROM STDIN"
        ) as copy:
            for sample in samples:
                copy.write_row(sample)


def _write_minutes(readings: list) -> None:
    """Fold readings into per-node, per-minute buckets with one upsert."""
    buckets: dict[tuple[int, int], list] = {}
    for ts, node, _, reading in readings:
        fields = reading["fields"]
        key = (node.id, int(ts // 60) * 60)
        bucket = buckets.setdefault(key, [0, None, 0.0, 0.0, 0.0])
        temperature = fields.get("DCGM_FI_DEV_GPU_TEMP")
        bucket[0] += 1
        if temperature is not None:
            bucket[1] = temperature if bucket[1] is None else max(bucket[1], temperature)
            bucket[2] += temperature
        bucket[3] += fields.get("DCGM_FI_DEV_POWER_USAGE") or 0.0
        bucket[4] += fields.get("DCGM_FI_DEV_GPU_UTIL") or 0.0
    table = "telemetry_nodeminute"
    greatest = "GREATEST" if connection.vendor == "postgresql" else "MAX"
    rows, params = [], []
    for (node_id, minute), (samples, t_max, t_sum, p_sum, u_sum) in buckets.items():
        rows.append("(%s, %s, %s, %s, %s, %s, %s)")
        params += [node_id, _dt(minute), samples, t_max, t_sum, p_sum, u_sum]
    sql = (
        f"INSERT INTO {table} (node_id, minute, samples, temperature_max, temperature_sum, power_sum, utilization_sum) "
        f"VALUES {', '.join(rows)} ON CONFLICT (node_id, minute) DO UPDATE SET "
        f"samples = {table}.samples + excluded.samples, "
        f"temperature_max = COALESCE({greatest}({table}.temperature_max, excluded.temperature_max), "
        f"excluded.temperature_max, {table}.temperature_max), "
        f"temperature_sum = {table}.temperature_sum + excluded.temperature_sum, "
        f"power_sum = {table}.power_sum + excluded.power_sum, "
        f"utilization_sum = {table}.utilization_sum + excluded.utilization_sum"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _ingest_nics(nics: list) -> list[extract.FaultCandidate]:
    if not nics:
        return []
    nics.sort(key=lambda item: item[0])
    nic_ids = {nic_id for _, _, nic_id, _ in nics}
    states = {}
    for row in NICState.objects.select_for_update().filter(nic_id__in=nic_ids).values(
            "nic_id", *[c for c in NIC_STATE_COLUMNS if c != "fields"]):
        row["ts"] = row["ts"].timestamp()
        states[row["nic_id"]] = row
    latest, faults = {}, []
    limit = settings.TELEMETRY_SYMBOL_ERRORS_PER_HOUR
    for ts, node, nic_id, nic in nics:
        prev = states.get(nic_id)
        if prev is not None and ts <= prev["ts"]:
            continue
        state, found = extract.nic_step(prev, ts, nic["link_state"], nic["fields"], symbol_rate_limit=limit)
        state.update(node_id=node.id, fields=nic["fields"])
        states[nic_id] = latest[nic_id] = state
        faults += [extract.FaultCandidate(kind, node.id, ts, nic_name=nic["name"], details=details) for kind, details in found]
    for state in latest.values():
        state["ts"] = _dt(state["ts"])
    upsert(NICState, "nic_id", NIC_STATE_COLUMNS, latest)
    return faults


def _ingest_facility(cluster_id: int, samples: list[dict]) -> None:
    if not samples:
        return
    samples.sort(key=lambda sample: sample["ts"])
    FacilitySample.objects.bulk_create([
        FacilitySample(cluster_id=cluster_id, ts=_dt(s["ts"]), source=s["source"], scope=s["scope"], target=s["target"],
                       device=s.get("device", ""), sensor=s.get("sensor", ""), metric=s["metric"], value=s["value"],
                       health=s.get("health") or "")
        for s in samples
    ])

    def key(s):
        return (s["scope"], s["target"], f"{s.get('device', '')}|{s.get('sensor', '')}|{s['metric']}")

    keys = {key(s) for s in samples}
    existing = FacilityState.objects.select_for_update().filter(
        cluster_id=cluster_id, target__in={k[1] for k in keys}, series__in={k[2] for k in keys})
    states = {(r.scope, r.target, r.series): {"ts": r.ts.timestamp(), "value": r.value, "ewma": r.ewma,
                                              "baseline": r.baseline, "trend": r.trend} for r in existing}
    metrics = {}
    for s in samples:
        k = key(s)
        if k in states and s["ts"] <= states[k]["ts"]:
            continue
        states[k] = extract.facility_step(states.get(k), s["ts"], s["value"])
        metrics[k] = s["metric"]
    FacilityState.objects.bulk_create(
        [FacilityState(cluster_id=cluster_id, scope=k[0], target=k[1], series=k[2], metric=metrics[k], ts=_dt(v["ts"]),
                       value=v["value"], ewma=v["ewma"], trend=v["trend"], baseline=v["baseline"])
         for k, v in states.items() if k in metrics],
        update_conflicts=True, unique_fields=["cluster", "scope", "target", "series"],
        update_fields=["metric", "ts", "value", "ewma", "trend", "baseline"],
    )


def _report_faults(candidates: list[extract.FaultCandidate]) -> list[int]:
    """Hand each hard fault to jobs (it stores first, merges duplicates, and queues handling on commit)."""
    if not candidates:
        return []
    nodes = Node.objects.in_bulk({c.node_id for c in candidates})
    ids = []
    for candidate in candidates:
        fault, _ = fault_ingest(
            source="agent", kind=candidate.kind, node=nodes[candidate.node_id], gpu_index=candidate.gpu_index,
            nic_name=candidate.nic_name, xid=candidate.xid, detected_at=_dt(candidate.ts), details=candidate.details,
        )
        ids.append(fault.pk)
    return ids
