"""What other apps record on the fleet's hardware rows: GPU health, NIC link state, a node's cooldown, risk score
and last-seen time.

These are internal services, called by other apps' services (recovery, escalation, telemetry ingest, the risk
sweep) inside their own transactions. Unlike the node state changes in ``nodes.py`` they do not audit or publish:
the caller's service does what its own action calls for. Each is a single statement whatever the number of rows
(so it is atomic on its own and needs no savepoint in the caller's transaction); the fault path and the ingest path
are hot, so the batch ones take the rows as a list and never write row by row.
"""

import functools
import operator
from collections.abc import Collection, Iterable
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from controlplane.bulk import update_rows
from fleet.choices import GPUHealth, LinkState
from fleet.models import GPU, NIC, Node

HEALTH_REASON_LENGTH = GPU._meta.get_field("health_reason").max_length


def gpus_mark(*, marks: Iterable[tuple[int, int, str, str]]) -> int:
    """Set the health of GPUs given as ``(node id, GPU index, health, reason)``; the reason is cut to the field's
    length, and a GPU listed twice takes its last mark. One UPDATE for the whole list. Returns how many GPUs were
    written (an unknown node or index is skipped). Raises ValueError for a health that is not a ``GPUHealth``."""
    last = {
        (node_id, index): (GPUHealth(health).value, reason[:HEALTH_REASON_LENGTH])
        for node_id, index, health, reason in marks
    }
    if not last:
        return 0
    if connection.vendor == "postgresql":
        # Four arrays rather than a CASE per row: the statement's text and its cost to build do not grow with
        # the list (Django's CASE WHEN compiling is what controlplane/bulk.py measured as the slow part).
        table, quote = GPU._meta.db_table, connection.ops.quote_name
        sql = (
            f"UPDATE {quote(table)} AS g SET health = v.health, health_reason = v.reason "
            "FROM unnest(%s::bigint[], %s::smallint[], %s::text[], %s::text[]) AS v(node_id, index, health, reason) "
            'WHERE g.node_id = v.node_id AND g."index" = v.index'
        )
        params = [
            [key[0] for key in last],
            [key[1] for key in last],
            [value[0] for value in last.values()],
            [value[1] for value in last.values()],
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount
    # Elsewhere (SQLite, for local runs): one UPDATE per distinct (health, reason).
    groups: dict[tuple[str, str], list[Q]] = {}
    for (node_id, index), value in last.items():
        groups.setdefault(value, []).append(Q(node_id=node_id, index=index))
    return sum(
        GPU.objects.filter(functools.reduce(operator.or_, which)).update(health=health, health_reason=reason)
        for (health, reason), which in sorted(groups.items())
    )


def node_gpus_mark(*, node_id: int, health: str, reason: str) -> int:
    """Set the health of every GPU of a node (a repaired node's GPUs count as healthy again). Returns how many."""
    return GPU.objects.filter(node_id=node_id).update(
        health=GPUHealth(health).value, health_reason=reason[:HEALTH_REASON_LENGTH]
    )


def nic_links_set(*, links: Iterable[tuple[int, str]], state: str) -> int:
    """Set the link state of NICs given as ``(node id, NIC name)``, in one UPDATE. Returns how many were written
    (a NIC the fleet does not know is skipped). Raises ValueError for a state that is not a ``LinkState``."""
    state = LinkState(state).value
    which = set(links)
    if not which:
        return 0
    if connection.vendor == "postgresql":
        table, quote = NIC._meta.db_table, connection.ops.quote_name
        sql = (
            f"UPDATE {quote(table)} AS n SET link_state = %s "
            "FROM unnest(%s::bigint[], %s::text[]) AS v(node_id, name) "
            "WHERE n.node_id = v.node_id AND n.name = v.name"
        )
        pairs = sorted(which)
        with connection.cursor() as cursor:
            cursor.execute(sql, [state, [p[0] for p in pairs], [p[1] for p in pairs]])
            return cursor.rowcount
    return NIC.objects.filter(
        functools.reduce(operator.or_, (Q(node_id=n, name=name) for n, name in which))
    ).update(link_state=state)


def node_nic_links_set(*, node_id: int, state: str) -> int:
    """Set the link state of every NIC of a node (a repaired node's links count as up again). Returns how many."""
    return NIC.objects.filter(node_id=node_id).update(link_state=LinkState(state).value)


def node_cool_down(*, node_id: int, seconds: float) -> datetime:
    """No job is migrated onto this node for ``seconds`` from now (anti-thrash): its cooldown ends then, whether that
    is sooner or later than an earlier cooldown's end. Returns the new end."""
    until = timezone.now() + timedelta(seconds=seconds)
    Node.objects.filter(pk=node_id).update(cooldown_until=until)
    return until


def nodes_mark_seen_sql(*, node_ids: Collection[int], at: datetime) -> tuple[str, list]:
    """The PostgreSQL UPDATE ``nodes_mark_seen`` runs, and its parameters, for a caller that folds it into one
    combined statement of its own (telemetry ingest's data-modifying WITH). Its text does not depend on how many
    nodes there are."""
    return (
        f"UPDATE {connection.ops.quote_name(Node._meta.db_table)} SET last_seen_at = %s "
        "WHERE id = ANY(%s::bigint[])",
        [at, list(node_ids)],
    )


def nodes_mark_seen(*, node_ids: Collection[int], at: datetime | None = None) -> int:
    """Record that these nodes reported: their last-seen time becomes ``at`` (by default now, the time the report
    was taken in, not the time of its readings). One UPDATE; nothing for no nodes. Returns how many were written."""
    if not node_ids:
        return 0
    at = at or timezone.now()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(*nodes_mark_seen_sql(node_ids=node_ids, at=at))
            return cursor.rowcount
    return Node.objects.filter(pk__in=node_ids).update(last_seen_at=at)


def nodes_set_risk(*, scores: dict[int, float], at: datetime) -> int:
    """Record the risk sweep's scores, ``{node id: score}``, as of ``at`` (the planner reads them from the node, so
    jobs needs no telemetry import). One statement per thousand nodes. Returns how many were written."""
    return update_rows(
        [Node(pk=node_id, risk_score=score, risk_updated_at=at) for node_id, score in scores.items()],
        ["risk_score", "risk_updated_at"],
    )
