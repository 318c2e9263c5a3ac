import math
from datetime import UTC, datetime, timedelta

import orjson
from django.conf import settings
from django.db import connection
from django.db.models import Avg, DateTimeField, F, Func, Max, QuerySet, Sum
from django.utils import timezone

from controlplane.access import principal
from telemetry.models import AgentToken, GPUSample
from tenancy.scoping import restrict

# Every table here is the provider's (none has a ``tenant_scope``): ``restrict`` gives tenant users none. A node's
# samples and latest state are read through its GPUs, NICs or the node itself, scoped as fleet scopes them.


def agent_token_list(*, user) -> QuerySet[AgentToken]:
    """Agent tokens are cluster credentials: provider roles only."""
    return restrict(AgentToken.objects.select_related("cluster"), user)


def notification_channel_list(*, user):
    from telemetry.models import NotificationChannel

    return restrict(NotificationChannel.objects.all(), user)


def notification_delivery_list(*, user):
    from telemetry.models import NotificationDelivery

    return restrict(NotificationDelivery.objects.select_related("channel"), user)


def prediction_list(*, user):
    from telemetry.models import Prediction

    return restrict(Prediction.objects.select_related("node"), user)


def risk_ranking(*, user, per_cluster: int = 15) -> list[dict]:
    """Per cluster, its riskiest nodes with their recent scores (for sparklines): provider roles."""
    from datetime import timedelta

    from django.utils import timezone

    from fleet.models import Cluster, Node
    from telemetry.models import RiskSample

    if not principal(user).is_provider:
        return []
    out = []
    since = timezone.now() - timedelta(hours=24)
    for cluster in Cluster.objects.order_by("name"):
        nodes = list(Node.objects.filter(cluster=cluster).order_by("-risk_score", "hostname")[:per_cluster])
        history: dict[int, list[float]] = {node.pk: [] for node in nodes}
        for node_id, score in (
            RiskSample.objects.filter(node_id__in=history.keys(), ts__gte=since)
            .order_by("ts")
            .values_list("node_id", "score")
        ):
            history[node_id].append(score)
        out.append(
            {"cluster": cluster, "nodes": [{"node": node, "history": history[node.pk]} for node in nodes]}
        )
    return out


# --- the node page's charts --------------------------------------------------------------------------------------

# The most points a chart's series gets: the window is cut into this many time buckets at most (date_bin in the
# database; plus the partial bucket at the window's start), never finer than the agent reports
# (AGENT_INTERVAL_SECONDS).
CHART_POINTS = 240
# Buckets line up on the Unix epoch, so a reload shows the same buckets.
_ORIGIN = datetime(1970, 1, 1, tzinfo=UTC)
# What the page charts of a NIC's latest counters (the agent's names; sysfs or InfiniBand, whichever it has).
NIC_COUNTERS = {
    "bytes": ("rx_bytes", "tx_bytes"),
    "errors": ("rx_errors", "tx_errors", "rx_crc_errors", "symbol_error", "port_rcv_errors"),
    "drops": ("rx_dropped", "tx_dropped", "port_xmit_discards"),
    "link changes": ("carrier_changes", "link_downed"),
}


class _TimeBucket(Func):
    """The start of the ``seconds``-wide bucket (from the Unix epoch) holding the time ``field``: date_bin on
    PostgreSQL, whole seconds since the epoch elsewhere (SQLite)."""

    output_field = DateTimeField()

    def __init__(self, field: str, seconds: int):
        super().__init__(F(field))
        self.seconds = int(seconds)

    def as_postgresql(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"date_bin(%s::interval, {sql}, %s::timestamptz)", [
            timedelta(seconds=self.seconds),
            *params,
            _ORIGIN,
        ]

    def as_sql(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        n = self.seconds
        return f"datetime((CAST(strftime('%%s', {sql}) AS INTEGER) / {n}) * {n}, 'unixepoch')", params


def chart_step(since: datetime, until: datetime) -> int:
    """The bucket width, whole seconds, that gives a window at most CHART_POINTS points."""
    span = (until - since).total_seconds()
    return max(int(settings.AGENT_INTERVAL_SECONDS), math.ceil(span / CHART_POINTS))


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _aligned(rows, keys: list[str], series_of) -> dict:
    """Rows of (series, bucket, *values) ordered by series then bucket, as one shared x (the buckets, ms) and,
    per value key and series, a list aligned with x (None where the series has no point)."""
    buckets = sorted({row[1] for row in rows})
    position = {bucket: i for i, bucket in enumerate(buckets)}
    values: dict[str, dict[str, list]] = {key: {} for key in keys}
    for row in rows:
        name = series_of(row[0])
        for key, value in zip(keys, row[2:], strict=True):
            line = values[key].setdefault(name, [None] * len(buckets))
            line[position[row[1]]] = None if value is None else round(value, 2)
    return {"x": [_ms(bucket) for bucket in buckets], "values": values}


# The per-GPU series a chart reads, as the samples query names them.
SERIES = ("temperature", "power", "utilization", "sbe", "dbe", "memory")
# The per-NIC series (counters: a bucket's highest reading), as the NIC samples query names them.
NIC_SERIES = ("rx_bytes", "tx_bytes", "errors", "drops", "link_changes")
# Series that are whole numbers (counters, bytes): a bucket's value is sent as an integer, not as 123.00 (bytes
# and counters have up to 14 digits; the decimals nearly doubled the page).
WHOLE = {"sbe", "dbe", "memory", *NIC_SERIES}
# GPU memory is charted in MiB (whole): bytes took 11 digits a point.
MIB = 2**20
# Up to this many readings to a bucket, a point is their mean; beyond, the bucket's first reading (_grid).
MEAN_SAMPLES = 10


def _has_data(data: dict) -> bool:
    return any(v is not None for lines in data["values"].values() for line in lines.values() for v in line)


def _point(name: str) -> str:
    """A bucket's aggregate of series ``name`` as charted: whole, or rounded to two decimals."""
    return f"s.{name}::bigint" if name in WHOLE else f"round(s.{name}::numeric, 2)"


def _grid(samples, devices, key: str, first: str, series, since: datetime, until: datetime, step: int):
    """PostgreSQL: the samples laid on the window's grid of buckets, one row per device with each series as a
    JSON array (None where a bucket has no sample), so Python touches no point; one statement. ``samples`` is
    grouped by (``key``, bucket); ``devices`` gives each device's ``gid``, ``gorder`` and ``glabel``; ``first``
    selects ``series`` from the raw table ``x`` for the device ``g.gid``. Where a bucket holds at most
    MEAN_SAMPLES readings a point is their aggregate (``samples``); beyond, the first reading in the bucket, found
    through the (device, ts) index, as a Prometheus range query steps (the cost then follows the points drawn,
    not the samples stored). Returns {label: [arrays per series]}, the x axis (ms) and which it did."""
    start = _ORIGIN + timedelta(seconds=(since - _ORIGIN).total_seconds() // step * step)
    points = int((until - start).total_seconds() // step) + 1
    ids, id_params = devices.order_by().values("gid", "gorder", "glabel").query.sql_with_params()
    grid = "grid AS (SELECT b FROM generate_series(%s::timestamptz, %s::timestamptz, %s::interval) AS b)"
    grid_params = [start, until, timedelta(seconds=step)]
    tail = "GROUP BY g.gid, g.gorder, g.glabel ORDER BY g.gorder, g.glabel"
    if step <= MEAN_SAMPLES * settings.AGENT_INTERVAL_SECONDS:
        how = "mean"
        arrays = ", ".join(f"json_agg({_point(name)} ORDER BY grid.b)::text" for name in series)
        inner, inner_params = samples.order_by().query.sql_with_params()
        sql = (
            f"WITH s AS ({inner}), g AS ({ids}), {grid} SELECT g.glabel, {arrays} FROM g CROSS JOIN grid "
            f"LEFT JOIN s ON s.{key} = g.gid AND s.bucket = grid.b {tail}"
        )
        params = [*inner_params, *id_params, *grid_params]
    else:
        how = "first"  # readings as the agent sent them: nothing to round
        arrays = ", ".join(f"json_agg(s.{name} ORDER BY grid.b)::text" for name in series)
        first = (
            f"{first} WHERE x.{key} = g.gid AND x.ts >= greatest(grid.b, %s) "
            "AND x.ts < least(grid.b + %s::interval, %s) ORDER BY x.ts LIMIT 1"
        )
        sql = (
            f"WITH g AS ({ids}), {grid} SELECT g.glabel, {arrays} FROM g CROSS JOIN grid "
            f"LEFT JOIN LATERAL ({first}) s ON true {tail}"
        )
        params = [*id_params, *grid_params, since, timedelta(seconds=step), until]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return rows, [_ms(start) + i * step * 1000 for i in range(points)], how


def _series_data(rows, x: list, series, label) -> dict:
    values: dict[str, dict[str, list]] = {name: {} for name in series}
    for glabel, *arrays in rows:
        for name, text in zip(series, arrays, strict=True):
            values[name][label(glabel)] = orjson.loads(text)
    return {"x": x, "values": values}


def _raw_kept(since: datetime, step: int) -> bool:
    """Whether the raw samples still hold the window (they are kept TELEMETRY_RAW_RETENTION_HOURS)."""
    kept = timezone.now() - timedelta(hours=settings.TELEMETRY_RAW_RETENTION_HOURS)
    return since >= kept - timedelta(seconds=step)


def node_gpu_series(*, user, node, since: datetime, until: datetime) -> dict:
    """Per GPU of ``node`` the user may see: temperature, power, utilisation, memory in use (MiB) and the ECC
    counters from the raw samples, at most CHART_POINTS buckets (``step`` seconds) each, in one query whatever
    the number of GPUs or samples (``point``: "mean" of a bucket's readings, or its "first" where a bucket holds
    many: _grid). Raw samples are kept TELEMETRY_RAW_RETENTION_HOURS; a window reaching further back reads the
    node's per-minute history instead (``per_gpu`` False: the mean of the node's GPUs and the hottest reading,
    per bucket; no ECC, no memory)."""
    from fleet.models import GPU, Node
    from telemetry.models import NodeMinute

    step = chart_step(since, until)
    if _raw_kept(since, step):
        gpus = restrict(GPU.objects.filter(node=node), user)
        samples = (
            GPUSample.objects.filter(gpu_id__in=gpus.values("id"), ts__gte=since, ts__lte=until)
            .annotate(bucket=_TimeBucket("ts", step))
            .values("gpu_id", "bucket")
            .annotate(
                temperature=Avg("temperature"),
                power=Avg("power"),
                utilization=Avg("utilization"),
                sbe=Max("sbe_total"),
                dbe=Max("dbe_total"),
                memory=Avg("memory_used") / MIB,
            )
            .order_by("gpu_id", "bucket")
        )
        if connection.vendor == "postgresql":
            first = (
                "SELECT temperature, power, utilization, sbe_total AS sbe, dbe_total AS dbe, "
                f"memory_used / {MIB} AS memory "
                f"FROM {GPUSample._meta.db_table} x"
            )
            devices = gpus.annotate(gid=F("id"), gorder=F("index"), glabel=F("index"))
            rows, x, how = _grid(samples, devices, "gpu_id", first, SERIES, since, until, step)
            data = _series_data(rows, x, SERIES, lambda index: f"GPU {index}")
        else:
            index = dict(gpus.values_list("id", "index"))
            rows = samples.values_list("gpu_id", "bucket", *SERIES)
            data, how = (
                _aligned(list(rows), list(SERIES), lambda gpu_id: f"GPU {index.get(gpu_id, '?')}"),
                "mean",
            )
        return {"per_gpu": True, "step": step, "point": how, "has_data": _has_data(data), **data}
    nodes = restrict(Node.objects.filter(pk=node.pk), user).values("pk")
    rows = list(
        NodeMinute.objects.filter(node__in=nodes, minute__gte=since, minute__lte=until)
        .annotate(bucket=_TimeBucket("minute", step))
        .values("node_id", "bucket")
        .annotate(
            n=Sum("samples"),
            t_sum=Sum("temperature_sum"),
            t_max=Max("temperature_max"),
            p_sum=Sum("power_sum"),
            u_sum=Sum("utilization_sum"),
        )
        .order_by("node_id", "bucket")
        .values_list("node_id", "bucket", "n", "t_sum", "t_max", "p_sum", "u_sum")
    )
    # per bucket: the means over every reading of every GPU, and the hottest reading
    name = f"mean of {node.hostname}'s GPUs"
    means = [
        (name, bucket, *(None if not n else total / n for total in (t, p, u)))
        for _, bucket, n, t, _, p, u in rows
    ]
    hottest = [("hottest GPU", bucket, t_max) for _, bucket, _, _, t_max, _, _ in rows]
    data = _aligned(means, ["temperature", "power", "utilization"], str)
    data["values"]["temperature"].update(_aligned(hottest, ["temperature"], str)["values"]["temperature"])
    data["values"].update(sbe={}, dbe={}, memory={})
    return {"per_gpu": False, "step": step, "point": "mean", "has_data": _has_data(data), **data}


def node_nic_series(*, user, node, since: datetime, until: datetime) -> dict:
    """Per NIC of ``node`` the user may see: bytes received and sent, errors, drops and link changes (counters,
    totals since boot: a bucket's highest reading, or its first where a bucket holds many) from the raw NIC
    samples, on the same buckets as node_gpu_series and in one query whatever the number of NICs or samples.
    A window reaching past the raw samples' retention has none (``kept`` False): NICs have no per-minute
    history."""
    from fleet.models import NIC
    from telemetry.models import NICSample

    step = chart_step(since, until)
    if not _raw_kept(since, step):
        return {"kept": False, "step": step, "point": "mean", "has_data": False, "x": [], "values": {}}
    nics = restrict(NIC.objects.filter(node=node), user)
    samples = (
        NICSample.objects.filter(nic_id__in=nics.values("id"), ts__gte=since, ts__lte=until)
        .annotate(bucket=_TimeBucket("ts", step))
        .values("nic_id", "bucket")
        .annotate(**{name: Max(name) for name in NIC_SERIES})
        .order_by("nic_id", "bucket")
    )
    if connection.vendor == "postgresql":
        first = f"SELECT {', '.join(NIC_SERIES)} FROM {NICSample._meta.db_table} x"
        devices = nics.annotate(gid=F("id"), gorder=F("rail"), glabel=F("name"))
        rows, x, how = _grid(samples, devices, "nic_id", first, NIC_SERIES, since, until, step)
        data = _series_data(rows, x, NIC_SERIES, str)
    else:
        names = dict(nics.values_list("id", "name"))
        rows = samples.values_list("nic_id", "bucket", *NIC_SERIES)
        data, how = _aligned(list(rows), list(NIC_SERIES), lambda nic_id: names.get(nic_id, "?")), "mean"
    return {"kept": True, "step": step, "point": how, "has_data": _has_data(data), **data}


def node_device_state(*, user, node) -> dict:
    """The latest reading of each GPU's memory and each NIC's counters (the agent does not keep them as series):
    two queries whatever the number of devices."""
    from fleet.models import GPU, NIC
    from telemetry.models import GPUState, NICState

    memory = [
        {"gpu": f"GPU {index}", "used": used, "total": total}
        for index, used, total in GPUState.objects.filter(
            gpu__in=restrict(GPU.objects.filter(node=node), user)
        )
        .order_by("gpu__index")
        .values_list("gpu__index", "fields__DCGM_FI_DEV_FB_USED", "fields__DCGM_FI_DEV_FB_TOTAL")
    ]
    nics = []
    for name, link_state, flaps, fields in (
        NICState.objects.filter(nic__in=restrict(NIC.objects.filter(node=node), user))
        .order_by("nic__rail", "nic__name")
        .values_list("nic__name", "link_state", "flaps", "fields")
    ):
        counters = {
            group: {name: fields[name] for name in names if isinstance(fields.get(name), int | float)}
            for group, names in NIC_COUNTERS.items()
        }
        counters["link changes"]["flaps seen"] = flaps
        nics.append({"nic": name, "link_state": link_state, "counters": counters})
    return {"memory": memory, "nics": nics}
