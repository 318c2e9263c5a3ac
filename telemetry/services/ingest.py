"""Telemetry ingest: one batch in one transaction, a fixed number of statements whatever its size.

Order of work: validate everything first (schema, clock skew, every node, GPU, rack the batch names — a
rejected batch stores nothing). Then, on PostgreSQL, two statements (telemetry/upsert.py): the first records
the batch id and, unless it was seen before (a duplicate changes nothing and locks nothing), locks and reads
the previous state of the GPUs, NICs and facility series the batch reports; the readings are folded in time
order (extract.py); the second writes raw GPU and NIC samples, latest state with features, the per-minute history,
facility series and the nodes' last-seen time. Hard faults go to jobs' ``fault_ingest_many``, which stores them
before anything acts on them. Elsewhere (SQLite) the ORM does the same reads and writes, a few more statements.
"""

import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import orjson
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from controlplane.errors import ServiceError
from controlplane.prepared import PreparedQuery
from fleet.models import Node
from fleet.services.hardware import nodes_mark_seen, nodes_mark_seen_sql
from jobs.services.faults import FaultReport, fault_ingest_many
from telemetry import extract
from telemetry.inventory import Inventory, inventory_for
from telemetry.models import (
    FacilitySample,
    FacilityState,
    GPUSample,
    GPUState,
    IngestBatch,
    NICSample,
    NICState,
    NodeMinute,
)
from telemetry.upsert import Statement, fetch, upsert
from telemetry.validation import parse_batch

GPU_STATE_COLUMNS = [
    "node_id",
    "ts",
    "fields",
    "temperature",
    "power",
    "utilization",
    "sbe_total",
    "dbe_total",
    "remapped_rows",
    "nvlink_errors",
    "nvlink_recovery_errors",
    "throttle_reasons",
    "recovery_action",
    "temperature_ewma",
    "temperature_slow",
    "temperature_trend",
    "sbe_rate",
    "remap_rate",
    "nvlink_rate",
    "throttle_share",
    "samples",
]
NIC_STATE_COLUMNS = [
    "node_id",
    "ts",
    "link_state",
    "fields",
    "link_downed",
    "symbol_errors",
    "link_error_recovery",
    "port_rcv_errors",
    "symbol_rate",
    "recovery_rate",
    "rcv_error_rate",
    "down_seconds",
    "flaps",
    "congestion_rate",
    "xmit_wait",
    "errors_at",
]
SAMPLE_COLUMNS = [
    "ts",
    "gpu_id",
    "temperature",
    "power",
    "utilization",
    "sbe_total",
    "dbe_total",
    "nvlink_errors",
    "throttle_reasons",
    "memory_used",
]
NIC_SAMPLE_COLUMNS = ["ts", "nic_id", "rx_bytes", "tx_bytes", "errors", "drops", "link_changes"]
# What a NIC sample sums of the agent's counters (sysfs or InfiniBand names; rx_crc_errors is part of rx_errors).
NIC_ERRORS = ("rx_errors", "tx_errors", "symbol_error", "port_rcv_errors")
NIC_DROPS = ("rx_dropped", "tx_dropped", "port_xmit_discards")
MINUTE_COLUMNS = [
    "node_id",
    "minute",
    "samples",
    "temperature_max",
    "temperature_sum",
    "power_sum",
    "utilization_sum",
]
FACILITY_SAMPLE_COLUMNS = [
    "cluster_id",
    "ts",
    "source",
    "scope",
    "target",
    "device",
    "sensor",
    "metric",
    "value",
    "health",
]
FACILITY_STATE_COLUMNS = [
    "cluster_id",
    "scope",
    "target",
    "series",
    "metric",
    "ts",
    "value",
    "ewma",
    "trend",
    "baseline",
]
# What a fold needs of the previous state (all of it but the reported fields), read with the row locked.
GPU_PREVIOUS = [c for c in GPU_STATE_COLUMNS if c != "fields"]
NIC_PREVIOUS = [c for c in NIC_STATE_COLUMNS if c != "fields"]
FACILITY_PREVIOUS = ["scope", "target", "series", "ts", "value", "ewma", "baseline", "trend"]


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
        return {
            "batch_id": self.batch_id,
            "duplicate": self.duplicate,
            "readings": self.readings,
            "nics": self.nics,
            "events": self.events,
            "facility": self.facility,
            "faults": self.faults,
        }


@dataclass
class Previous:
    """The recorded batch's row id and the locked previous state: {gpu id: state}, {nic id: state},
    {(scope, target, series): state}, times as Unix seconds."""

    batch_pk: int
    gpus: dict = field(default_factory=dict)
    nics: dict = field(default_factory=dict)
    facility: dict = field(default_factory=dict)


@dataclass
class Writes:
    """Everything a batch writes, as rows (dicts keyed by column)."""

    samples: list = field(default_factory=list)
    nic_samples: list = field(default_factory=list)
    gpus: list = field(default_factory=list)
    minutes: list = field(default_factory=list)
    nics: list = field(default_factory=list)
    facility_samples: list = field(default_factory=list)
    facility_states: list = field(default_factory=list)
    nodes: set = field(default_factory=set)


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def _int(value):
    """A counter as an int: JSON Schema's integers include 3.0, which an integer column would refuse as text."""
    return value if value is None or type(value) is int else int(value)


def _check_time(value: float, name: str, now: float, *, past: float) -> None:
    skew = settings.TELEMETRY_MAX_SKEW_SECONDS
    if value > now + skew:
        raise ServiceError(
            f"{value} is {value - now:.0f}s in the future (clock skew above {skew}s)", field=name
        )
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


def _series(sample: dict) -> tuple[str, str, str]:
    return (
        sample["scope"],
        sample["target"],
        f"{sample.get('device', '')}|{sample.get('sensor', '')}|{sample['metric']}",
    )


def _require_finite(writes: Writes) -> None:
    """An extreme reading the schema let through must not become an infinite or NaN derived value (an EWMA, a
    rate): the batch is refused with a 400 (the agent logs it and keeps it in its rejected spool; a 409 it would
    count as delivered), and nothing is stored."""
    for name in ("samples", "nic_samples", "gpus", "minutes", "nics", "facility_samples", "facility_states"):
        for row in getattr(writes, name):
            values = row.values() if isinstance(row, dict) else row
            for value in values:
                if isinstance(value, float) and not math.isfinite(value):
                    raise ServiceError(
                        f"a reading gives a non-finite {name} value; check the agent's readings",
                        field="readings",
                    )


def telemetry_ingest(*, cluster, body: bytes) -> IngestResult:
    """Take in one batch for ``cluster`` (the agent token's). Raises ServiceError (400) on anything invalid."""
    batch = parse_batch(body)
    now = time.time()
    inventory = inventory_for(cluster.pk)
    resolved = _resolve(batch, inventory, now)
    result = IngestResult(
        batch_id=batch["batch_id"],
        readings=len(resolved["readings"]),
        nics=len(resolved["nics"]),
        events=len(resolved["events"]),
        facility=len(resolved["facility"]),
    )
    store = PostgresStore if connection.vendor == "postgresql" else PortableStore
    with transaction.atomic():
        previous = store.begin(cluster.pk, result, resolved)
        if previous is None:
            result.duplicate = True
            return result
        writes = Writes()
        try:
            candidates = _fold_gpus(resolved["readings"], previous.gpus, writes)
            candidates += _fold_nics(resolved["nics"], previous.nics, writes)
            _fold_facility(cluster.pk, resolved["facility"], previous.facility, writes)
        except (OverflowError, ZeroDivisionError) as error:
            raise ServiceError(f"a reading is out of range: {error}", field="readings") from error
        _require_finite(writes)
        for ts, node, event in resolved["events"]:
            candidates.append(
                extract.FaultCandidate(
                    "gpu_xid",
                    node.id,
                    ts,
                    gpu_index=event.get("gpu"),
                    xid=event["xid"],
                    details={"uuid": event.get("uuid", "")},
                )
            )
        store.write(writes)
        result.faults = _report_faults(candidates)
        if result.faults:
            IngestBatch.objects.filter(pk=previous.batch_pk).update(faults=len(result.faults))
    return result


# --- folding readings into state (no database) -----------------------------------------------------------


def _fold_gpus(readings: list, states: dict, writes: Writes) -> list[extract.FaultCandidate]:
    if not readings:
        return []
    readings.sort(key=lambda item: item[0])
    faults, latest = [], {}
    limit = settings.TELEMETRY_THERMAL_CELSIUS
    buckets: dict[tuple[int, int], list] = {}
    for ts, node, gpu_id, reading in readings:
        fields = reading["fields"]
        temperature = fields.get("DCGM_FI_DEV_GPU_TEMP")
        power = fields.get("DCGM_FI_DEV_POWER_USAGE")
        utilization = fields.get("DCGM_FI_DEV_GPU_UTIL")
        writes.samples.append(
            {
                "ts": _dt(ts),
                "gpu_id": gpu_id,
                "temperature": temperature,
                "power": power,
                "utilization": utilization,
                "sbe_total": _int(fields.get("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")),
                "dbe_total": _int(fields.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")),
                "nvlink_errors": extract.nvlink_total(fields),
                "throttle_reasons": _int(fields.get("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")),
                "memory_used": _int(fields.get("DCGM_FI_DEV_FB_USED")),
            }
        )
        # the per-node, per-minute history: samples, max and sum of temperature, sums of power and utilisation
        bucket = buckets.setdefault((node.id, int(ts // 60) * 60), [0, None, 0.0, 0.0, 0.0])
        bucket[0] += 1
        if temperature is not None:
            bucket[1] = temperature if bucket[1] is None else max(bucket[1], temperature)
            bucket[2] += temperature
        bucket[3] += power or 0.0
        bucket[4] += utilization or 0.0
        writes.nodes.add(node.id)
        prev = states.get(gpu_id)
        if prev is not None and prev["ts"] is not None and ts <= prev["ts"]:
            continue  # an older reading (a spool replay) is history, not the latest state
        state, found = extract.gpu_step(prev, ts, fields, thermal_limit=limit)
        state.update(
            node_id=node.id,
            fields=fields,
            power=power,
            utilization=utilization,
            recovery_action=reading.get("recovery_action", ""),
        )
        states[gpu_id] = latest[gpu_id] = state
        faults += [
            extract.FaultCandidate(kind, node.id, ts, gpu_index=reading["gpu"], details=details)
            for kind, details in found
        ]
    for gpu_id, state in latest.items():
        row = {c: state.get(c) for c in GPU_STATE_COLUMNS}
        row.update(
            gpu_id=gpu_id,
            ts=_dt(state["ts"]),
            sbe_total=_int(state["sbe_total"]),
            dbe_total=_int(state["dbe_total"]),
            remapped_rows=_int(state["remapped_rows"]),
            nvlink_recovery_errors=_int(state.get("recovery_errors", 0)),
            recovery_action=state.get("recovery_action") or "",
        )
        writes.gpus.append(row)
    writes.minutes += [
        {
            "node_id": node_id,
            "minute": _dt(minute),
            "samples": samples,
            "temperature_max": t_max,
            "temperature_sum": t_sum,
            "power_sum": p_sum,
            "utilization_sum": u_sum,
        }
        for (node_id, minute), (samples, t_max, t_sum, p_sum, u_sum) in buckets.items()
    ]
    return faults


def _counter_sum(fields: dict, names: tuple[str, ...]) -> int | None:
    """The sum of those of ``names`` the NIC reports as numbers; None where it reports none."""
    values = [_int(fields[name]) for name in names if isinstance(fields.get(name), int | float)]
    return sum(values) if values else None


def _nic_sample(ts: float, nic_id: int, fields: dict) -> dict:
    link = fields.get("carrier_changes")
    return {
        "ts": _dt(ts),
        "nic_id": nic_id,
        "rx_bytes": _counter_sum(fields, ("rx_bytes",)),
        "tx_bytes": _counter_sum(fields, ("tx_bytes",)),
        "errors": _counter_sum(fields, NIC_ERRORS),
        "drops": _counter_sum(fields, NIC_DROPS),
        "link_changes": _counter_sum(fields, ("carrier_changes",) if link is not None else ("link_downed",)),
    }


def _fold_nics(nics: list, states: dict, writes: Writes) -> list[extract.FaultCandidate]:
    if not nics:
        return []
    nics.sort(key=lambda item: item[0])
    latest, faults = {}, []
    limit = settings.TELEMETRY_SYMBOL_ERRORS_PER_HOUR
    for ts, node, nic_id, nic in nics:
        writes.nodes.add(node.id)
        writes.nic_samples.append(_nic_sample(ts, nic_id, nic["fields"]))
        prev = states.get(nic_id)
        if prev is not None and ts <= prev["ts"]:
            continue
        state, found = extract.nic_step(prev, ts, nic["link_state"], nic["fields"], symbol_rate_limit=limit)
        state.update(node_id=node.id, fields=nic["fields"])
        states[nic_id] = latest[nic_id] = state
        faults += [
            extract.FaultCandidate(kind, node.id, ts, nic_name=nic["name"], details=details)
            for kind, details in found
        ]
    for nic_id, state in latest.items():
        row = {c: state[c] for c in NIC_STATE_COLUMNS}
        row.update(
            nic_id=nic_id,
            ts=_dt(state["ts"]),
            errors_at=_dt(state["errors_at"]) if state.get("errors_at") else None,
            link_downed=_int(state["link_downed"]),
            flaps=_int(state["flaps"]),
            symbol_errors=_int(state["symbol_errors"]),
            link_error_recovery=_int(state["link_error_recovery"]),
            port_rcv_errors=_int(state["port_rcv_errors"]),
            xmit_wait=_int(state["xmit_wait"]),
        )
        writes.nics.append(row)
    return faults


def _fold_facility(cluster_id: int, samples: list[dict], states: dict, writes: Writes) -> None:
    if not samples:
        return
    samples.sort(key=lambda sample: sample["ts"])
    metrics = {}
    for s in samples:
        writes.facility_samples.append(
            {
                "cluster_id": cluster_id,
                "ts": _dt(s["ts"]),
                "source": s["source"],
                "scope": s["scope"],
                "target": s["target"],
                "device": s.get("device", ""),
                "sensor": s.get("sensor", ""),
                "metric": s["metric"],
                "value": s["value"],
                "health": s.get("health") or "",
            }
        )
        key = _series(s)
        if key in states and s["ts"] <= states[key]["ts"]:
            continue
        states[key] = extract.facility_step(states.get(key), s["ts"], s["value"])
        metrics[key] = s["metric"]
    writes.facility_states += [
        {
            "cluster_id": cluster_id,
            "scope": key[0],
            "target": key[1],
            "series": key[2],
            "metric": metric,
            "ts": _dt(states[key]["ts"]),
            **{c: states[key][c] for c in ("value", "ewma", "trend", "baseline")},
        }
        for key, metric in metrics.items()
    ]


# --- the database: PostgreSQL in two statements, the ORM elsewhere -------------------------------------------


TIME_COLUMNS = ("ts", "errors_at")


def _locked(table: str, columns: list[str], where: str) -> str:
    """A scalar subquery: the matching rows of ``table``, locked, as one JSON array (times as Unix seconds); none
    when the batch was a duplicate."""
    names = ", ".join(f"extract(epoch FROM {c})::float8 AS {c}" if c in TIME_COLUMNS else c for c in columns)
    return (
        f"(SELECT json_agg(s)::text FROM (SELECT {names} FROM {table} WHERE {where} "
        f"AND EXISTS (SELECT FROM batch) FOR UPDATE) s)"
    )


class PostgresStore:
    @staticmethod
    def begin(cluster_id: int, result: IngestResult, resolved: dict) -> Previous | None:
        """Record the batch id and lock and read the previous state, in one statement; None for a duplicate."""
        gpu_ids = list({gpu_id for _, _, gpu_id, _ in resolved["readings"]})
        nic_ids = list({nic_id for _, _, nic_id, _ in resolved["nics"]})
        series = {_series(s) for s in resolved["facility"]}
        sql = (
            f"WITH batch AS (INSERT INTO {IngestBatch._meta.db_table} "
            "(batch_id, cluster_id, received_at, readings, nics, events, facility, faults) "
            "VALUES (%s::uuid, %s, %s, %s, %s, %s, %s, 0) ON CONFLICT (cluster_id, batch_id) DO NOTHING RETURNING id) "
            "SELECT (SELECT id FROM batch), "
            + ", ".join(
                [
                    _locked(GPUState._meta.db_table, ["gpu_id", *GPU_PREVIOUS], "gpu_id = ANY(%s::bigint[])"),
                    _locked(NICState._meta.db_table, ["nic_id", *NIC_PREVIOUS], "nic_id = ANY(%s::bigint[])"),
                    _locked(
                        FacilityState._meta.db_table,
                        FACILITY_PREVIOUS,
                        "cluster_id = %s AND target = ANY(%s::text[]) AND series = ANY(%s::text[])",
                    ),
                ]
            )
        )
        row = fetch(
            sql,
            [
                result.batch_id,
                cluster_id,
                timezone.now(),
                result.readings,
                result.nics,
                result.events,
                result.facility,
                gpu_ids,
                nic_ids,
                cluster_id,
                list({k[1] for k in series}),
                list({k[2] for k in series}),
            ],
        )
        if row[0] is None:
            return None
        previous = Previous(batch_pk=row[0])
        for state in orjson.loads(row[1] or "[]"):
            state["recovery_errors"] = state["nvlink_recovery_errors"]
            previous.gpus[state["gpu_id"]] = state
        previous.nics = {state["nic_id"]: state for state in orjson.loads(row[2] or "[]")}
        previous.facility = {
            key: state
            for state in orjson.loads(row[3] or "[]")
            if (key := (state["scope"], state["target"], state["series"])) in series
        }
        return previous

    @staticmethod
    def write(writes: Writes) -> None:
        statement = Statement()
        statement.insert(GPUSample, SAMPLE_COLUMNS, writes.samples)
        statement.upsert(GPUState, "gpu_id", GPU_STATE_COLUMNS, writes.gpus)
        statement.insert(
            NodeMinute,
            MINUTE_COLUMNS,
            writes.minutes,
            conflict="node_id, minute",
            update=_minute_sums("GREATEST"),
        )
        statement.upsert(NICState, "nic_id", NIC_STATE_COLUMNS, writes.nics)
        statement.insert(NICSample, NIC_SAMPLE_COLUMNS, writes.nic_samples)
        statement.insert(FacilitySample, FACILITY_SAMPLE_COLUMNS, writes.facility_samples)
        statement.insert(
            FacilityState,
            FACILITY_STATE_COLUMNS,
            writes.facility_states,
            conflict="cluster_id, scope, target, series",
            update="metric = excluded.metric, ts = excluded.ts, value = excluded.value, "
            "ewma = excluded.ewma, trend = excluded.trend, baseline = excluded.baseline",
        )
        if writes.nodes:
            statement.update(*nodes_mark_seen_sql(node_ids=writes.nodes, at=timezone.now()))
        statement.execute()


class PortableStore:
    """The same reads and writes through the ORM (SQLite for local runs)."""

    @staticmethod
    def begin(cluster_id: int, result: IngestResult, resolved: dict) -> Previous | None:
        try:
            with transaction.atomic():
                row = IngestBatch.objects.create(
                    batch_id=result.batch_id,
                    cluster_id=cluster_id,
                    received_at=timezone.now(),
                    readings=result.readings,
                    nics=result.nics,
                    events=result.events,
                    facility=result.facility,
                )
        except IntegrityError:
            return None
        previous = Previous(batch_pk=row.pk)
        gpu_ids = {gpu_id for _, _, gpu_id, _ in resolved["readings"]}
        for state in (
            GPUState.objects.select_for_update().filter(gpu_id__in=gpu_ids).values("gpu_id", *GPU_PREVIOUS)
        ):
            state.update(ts=state["ts"].timestamp(), recovery_errors=state["nvlink_recovery_errors"])
            previous.gpus[state["gpu_id"]] = state
        nic_ids = {nic_id for _, _, nic_id, _ in resolved["nics"]}
        for state in (
            NICState.objects.select_for_update().filter(nic_id__in=nic_ids).values("nic_id", *NIC_PREVIOUS)
        ):
            state["ts"] = state["ts"].timestamp()
            state["errors_at"] = state["errors_at"].timestamp() if state["errors_at"] else None
            previous.nics[state["nic_id"]] = state
        series = {_series(s) for s in resolved["facility"]}
        if series:
            for state in (
                FacilityState.objects.select_for_update()
                .filter(
                    cluster_id=cluster_id,
                    target__in={k[1] for k in series},
                    series__in={k[2] for k in series},
                )
                .values(*FACILITY_PREVIOUS)
            ):
                key = (state["scope"], state["target"], state["series"])
                if key in series:
                    previous.facility[key] = dict(state, ts=state["ts"].timestamp())
        return previous

    @staticmethod
    def write(writes: Writes) -> None:
        GPUSample.objects.bulk_create([GPUSample(**row) for row in writes.samples], batch_size=2000)
        upsert(GPUState, "gpu_id", GPU_STATE_COLUMNS, writes.gpus)
        _upsert_minutes(writes.minutes)
        upsert(NICState, "nic_id", NIC_STATE_COLUMNS, writes.nics)
        NICSample.objects.bulk_create([NICSample(**row) for row in writes.nic_samples], batch_size=2000)
        FacilitySample.objects.bulk_create([FacilitySample(**row) for row in writes.facility_samples])
        FacilityState.objects.bulk_create(
            [FacilityState(**row) for row in writes.facility_states],
            update_conflicts=True,
            unique_fields=["cluster", "scope", "target", "series"],
            update_fields=["metric", "ts", "value", "ewma", "trend", "baseline"],
        )
        nodes_mark_seen(node_ids=writes.nodes)


def _minute_sums(greatest: str) -> str:
    """How a minute's bucket takes in more samples: counts and sums add up, the maximum is the greater."""
    table = NodeMinute._meta.db_table
    return (
        f"samples = {table}.samples + excluded.samples, temperature_max = COALESCE({greatest}({table}.temperature_max, "
        f"excluded.temperature_max), excluded.temperature_max, {table}.temperature_max), "
        f"temperature_sum = {table}.temperature_sum + excluded.temperature_sum, "
        f"power_sum = {table}.power_sum + excluded.power_sum, "
        f"utilization_sum = {table}.utilization_sum + excluded.utilization_sum"
    )


def _upsert_minutes(rows: list[dict]) -> None:
    """Add per-minute buckets to the history with one INSERT … ON CONFLICT (SQLite has it too)."""
    if not rows:
        return
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(rows))
    greatest = "GREATEST" if connection.vendor == "postgresql" else "MAX"
    sql = (
        f"INSERT INTO {NodeMinute._meta.db_table} ({', '.join(MINUTE_COLUMNS)}) VALUES {values} "
        f"ON CONFLICT (node_id, minute) DO UPDATE SET {_minute_sums(greatest)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [row[c] for row in rows for c in MINUTE_COLUMNS])


# The nodes a batch's faults are on, with their cluster: compiled once per process (controlplane/prepared.py). The
# cluster's driver credentials (``connection``, encrypted) stay unloaded, as in the agent token's lookup: the fault
# path reads the cluster's key and its dedicated tenant, and loading them would decrypt them on every fault batch.
_NODES = PreparedQuery(
    lambda ids: Node.objects.select_related("cluster").defer("cluster__connection").filter(pk__in_array=ids),
    ids=list[int],
)


def _report_faults(candidates: list[extract.FaultCandidate]) -> list[int]:
    """Hand each hard fault to jobs (it stores first, merges duplicates, and queues handling on commit)."""
    if not candidates:
        return []
    nodes = {node.pk: node for node in _NODES.rows(ids=sorted({c.node_id for c in candidates}))}
    stored = fault_ingest_many(
        source="agent",
        reports=[
            FaultReport(
                kind=c.kind,
                node=nodes[c.node_id],
                gpu_index=c.gpu_index,
                nic_name=c.nic_name,
                xid=c.xid,
                detected_at=_dt(c.ts),
                details=c.details,
            )
            for c in candidates
        ],
    )
    return [fault.pk for fault, _ in stored]
