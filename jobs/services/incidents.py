"""Incidents: every report of one failure folds into one Incident (rules in docs/incidents.md).

``incident_join`` runs inside fault intake, with the node's incident lock held, so two reports of one failure
arriving at once from two sources join one incident instead of opening two.
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection

from controlplane.prepared import cursor as prepared_cursor
from jobs.choices import ACTIVE_ACTION_STATES, INCIDENT_SEVERITY, FaultKind, IncidentScope, IncidentState
from jobs.models import FaultEvent, Incident, RecoveryAction

NIC_KINDS = frozenset({FaultKind.NIC_DOWN, FaultKind.LINK_FLAP, FaultKind.LINK_DEGRADED})


def severity_rank(kind: str, *, fatal: bool) -> int:
    """Where a report stands in INCIDENT_SEVERITY (0 is the most severe); a gpu_xid that takes the GPU out of
    service ranks as fatal."""
    name = "gpu_xid_fatal" if kind == FaultKind.GPU_XID and fatal else kind
    return INCIDENT_SEVERITY.index(name) if name in INCIDENT_SEVERITY else len(INCIDENT_SEVERITY)


def _under_way():
    """Recovery actions under way (decided, not ended, not a dry run): while one of an incident's is, it stays open."""
    return RecoveryAction.objects.filter(dry_run=False, state__in=ACTIVE_ACTION_STATES)


def _window() -> timedelta:
    return timedelta(seconds=settings.FAULT_CORRELATION_SECONDS)


def incident_is_open(incident: Incident, now: datetime) -> bool:
    """Open while a report is younger than the correlation window, or while a recovery of it is under way."""
    if incident.state != IncidentState.OPEN:
        return False
    if incident.last_reported_at >= now - _window():
        return True
    return _under_way().filter(incident=incident).exists()


# Joining on PostgreSQL, in one statement (fault intake is the hot path): resolve the node's stale open incident,
# fold the report into the one still open (escalating its kind, widening a NIC scope), or open a new one.
JOIN_SQL = """
WITH found AS (
    SELECT i.id FROM {incident} i
    WHERE i.node_id = %(node)s AND i.state = 'open' AND (i.last_reported_at >= %(cutoff)s OR EXISTS (
        SELECT 1 FROM {action} a WHERE a.incident_id = i.id AND NOT a.dry_run AND a.state IN ('planned', 'running')))
    ORDER BY i.id DESC LIMIT 1
), stale AS (
    UPDATE {incident} i SET state = 'resolved', resolved_at = %(now)s
    WHERE i.node_id = %(node)s AND i.state = 'open' AND i.id NOT IN (SELECT id FROM found) RETURNING i.id
), joined AS (
    UPDATE {incident} i SET
        report_count = i.report_count + %(count)s, last_reported_at = %(now)s, opened_at = LEAST(i.opened_at, %(detected)s),
        scope = CASE WHEN i.scope = 'nic' AND NOT (%(one_nic)s AND i.nic_name = %(nic)s) THEN 'node' ELSE i.scope END,
        nic_name = CASE WHEN i.scope = 'nic' AND NOT (%(one_nic)s AND i.nic_name = %(nic)s) THEN '' ELSE i.nic_name END,
        kind = CASE WHEN %(rank)s < i.rank THEN %(kind)s ELSE i.kind END,
        xid = CASE WHEN %(rank)s < i.rank THEN %(xid)s::integer ELSE i.xid END,
        fatal = CASE WHEN %(rank)s < i.rank THEN %(fatal)s ELSE i.fatal END,
        rank = LEAST(i.rank, %(rank)s)
    FROM found WHERE i.id = found.id RETURNING i.id
), opened AS (
    INSERT INTO {incident} (cluster_id, node_id, scope, nic_name, kind, xid, fatal, rank, state, opened_at,
                            last_reported_at, report_count)
    SELECT %(cluster)s, %(node)s, CASE WHEN %(one_nic)s THEN 'nic' ELSE 'node' END,
           CASE WHEN %(one_nic)s THEN %(nic)s ELSE '' END, %(kind)s, %(xid)s::integer, %(fatal)s, %(rank)s, 'open',
           %(detected)s, %(now)s, %(count)s
    WHERE NOT EXISTS (SELECT 1 FROM joined) RETURNING id
)
SELECT id FROM joined UNION ALL SELECT id FROM opened
"""


def incident_join(*, fault: FaultEvent, fatal: bool, now: datetime) -> int:
    """Open the node's incident for a new fault, or fold the fault into the one already open, escalating its kind
    and widening its scope as the rules say (a stale one is resolved first); sets ``fault.incident_id`` (the
    caller saves the fault) and returns it. The caller holds the node's lock."""
    join = _join_in_one_statement if connection.vendor == "postgresql" else _join_with_the_orm
    fault.incident_id = join(
        fault,
        on_one_nic=fault.kind in NIC_KINDS and bool(fault.nic_name),
        rank=severity_rank(fault.kind, fatal=fatal),
        fatal=fatal,
        now=now,
    )
    return fault.incident_id


def incident_join_many(*, faults: list[tuple[FaultEvent, bool]], now: datetime) -> int:
    """``incident_join`` for several new faults of one node, in their order, with the same result as joining them
    one by one; on PostgreSQL in one statement (an agent's batch reports a node's eight NICs down together). Each
    item is (fault, whether it is fatal); sets every fault's ``incident_id`` and returns it."""
    if len(faults) == 1 or connection.vendor != "postgresql":
        for fault, fatal in faults:
            incident_join(fault=fault, fatal=fatal, now=now)
        return faults[-1][0].incident_id
    if len({fault.node_id for fault, _ in faults}) != 1:
        raise ValueError("incident_join_many joins the faults of one node")
    # Folded one by one, the incident counts every report, starts at the earliest detection, keeps a NIC scope only
    # while every report is on that one NIC, and takes the kind of the first of the most severe.
    ranks = [severity_rank(fault.kind, fatal=fatal) for fault, fatal in faults]
    worst = ranks.index(min(ranks))
    nics = {fault.nic_name if fault.kind in NIC_KINDS and fault.nic_name else None for fault, _ in faults}
    decisive, fatal = faults[worst]
    incident_id = _execute_join(
        faults[0][0],
        on_one_nic=len(nics) == 1 and None not in nics,
        rank=ranks[worst],
        kind=decisive.kind,
        xid=decisive.xid,
        fatal=fatal,
        detected=min(fault.detected_at for fault, _ in faults),
        count=len(faults),
        now=now,
    )
    for fault, _ in faults:
        fault.incident_id = incident_id
    return incident_id


def _join_in_one_statement(
    fault: FaultEvent, *, on_one_nic: bool, rank: int, fatal: bool, now: datetime
) -> int:
    return _execute_join(
        fault,
        on_one_nic=on_one_nic,
        rank=rank,
        kind=fault.kind,
        xid=fault.xid,
        fatal=fatal,
        detected=fault.detected_at,
        count=1,
        now=now,
    )


def _execute_join(
    fault: FaultEvent,
    *,
    on_one_nic: bool,
    rank: int,
    kind: str,
    xid,
    fatal: bool,
    detected,
    count: int,
    now: datetime,
) -> int:
    sql = JOIN_SQL.format(incident=Incident._meta.db_table, action=RecoveryAction._meta.db_table)
    with prepared_cursor() as cursor:
        cursor.execute(
            sql,
            {
                "node": fault.node_id,
                "cluster": fault.cluster_id,
                "cutoff": now - _window(),
                "now": now,
                "detected": detected,
                "one_nic": on_one_nic,
                "nic": fault.nic_name,
                "rank": rank,
                "kind": kind,
                "xid": xid,
                "fatal": fatal,
                "count": count,
            },
        )
        return cursor.fetchone()[0]


def _join_with_the_orm(fault: FaultEvent, *, on_one_nic: bool, rank: int, fatal: bool, now: datetime) -> int:
    """``JOIN_SQL``'s rules, statement by statement (SQLite, the embedded default)."""
    incident = (
        Incident.objects.select_for_update(of=("self",), no_key=True)
        .filter(node_id=fault.node_id, state=IncidentState.OPEN)
        .order_by("-pk")
        .first()
    )
    if incident is not None and not incident_is_open(incident, now):
        incident_resolve(incident=incident, at=now)
        incident = None
    if incident is None:
        return Incident.objects.create(
            cluster_id=fault.cluster_id,
            node_id=fault.node_id,
            scope=IncidentScope.NIC if on_one_nic else IncidentScope.NODE,
            nic_name=fault.nic_name if on_one_nic else "",
            kind=fault.kind,
            xid=fault.xid,
            fatal=fatal,
            rank=rank,
            opened_at=fault.detected_at,
            last_reported_at=now,
        ).pk
    if incident.scope == IncidentScope.NIC and not (on_one_nic and fault.nic_name == incident.nic_name):
        incident.scope, incident.nic_name = IncidentScope.NODE, ""  # several NICs, or the node itself
    if rank < incident.rank:
        incident.kind, incident.xid, incident.fatal, incident.rank = fault.kind, fault.xid, fatal, rank
    incident.report_count += 1
    incident.last_reported_at = now
    incident.opened_at = min(incident.opened_at, fault.detected_at)
    incident.save(
        update_fields=[
            "scope",
            "nic_name",
            "kind",
            "xid",
            "fatal",
            "rank",
            "report_count",
            "last_reported_at",
            "opened_at",
        ]
    )
    return incident.pk


def incident_report(*, incident_id: int | None, now: datetime) -> None:
    """Another report of a fault already stored (merged into it): its incident counts it and stays open."""
    if incident_id is None:
        return
    # One plain statement of fixed text (prepared once per pooled connection): every merged report comes here,
    # and the ORM's update with an F() expression cost more to build than to run.
    table = connection.ops.quote_name(Incident._meta.db_table)
    with prepared_cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET report_count = report_count + 1, last_reported_at = %s WHERE id = %s",
            [connection.ops.adapt_datetimefield_value(now), incident_id],
        )


def incident_resolve(*, incident: Incident, at: datetime) -> None:
    incident.state, incident.resolved_at = IncidentState.RESOLVED, at
    incident.save(update_fields=["state", "resolved_at"])


def incidents_sweep(*, now: datetime) -> int:
    """Resolve the open incidents whose window has passed and whose recoveries have ended (beat). Returns how many."""
    stale = Incident.objects.filter(state=IncidentState.OPEN, last_reported_at__lt=now - _window())
    busy = _under_way().filter(incident__isnull=False).values("incident_id")
    return stale.exclude(pk__in=busy).update(state=IncidentState.RESOLVED, resolved_at=now)
