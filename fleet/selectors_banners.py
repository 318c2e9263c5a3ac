"""What holds automation or node maintenance back, for the banners every page shows (templates/base.html).

Three things hold work back, each over the scope its model gives it:

- the provider's ``AutomationSwitch`` (one row): paused or dry-run everywhere, so on every page;
- a fleet's and a cluster's own ``automation`` mode: on the pages of that cluster (and of the fleet's clusters),
  its nodes, jobs and incidents;
- a fleet's caps on cordoned and draining nodes (the circuit breaker, ``fleet.services.nodes``): tripped when the
  next cordon or drain would be refused; on the pages of the fleet's clusters and theirs.

Each banner says who set it and when: the switch's own fields, otherwise the audit trail. Provider roles read
names, reasons and counts; a tenant user sees only the holds over the clusters and jobs it may see, set "by the
provider", without reasons, counts, fleet names or another tenant's nodes."""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q
from django.utils.module_loading import import_string

from controlplane.access import principal
from controlplane.models import AuditEntry
from fleet.choices import AutomationMode, NodeState
from fleet.models import AutomationSwitch, Cluster, Fleet, Node
from fleet.services.nodes import DISRUPTED, _Caps, share_allowance

PROVIDER = "the provider"
UNRECORDED = "not in the audit trail"
WHAT = {
    AutomationMode.PAUSED: "Automation paused",
    AutomationMode.DRY_RUN: "Automation in dry run",
}
EFFECT = {
    AutomationMode.PAUSED: "fault recovery, escalation, drift correction and rollout steps are held",
    AutomationMode.DRY_RUN: "fault recovery, escalation, drift correction and rollout steps decide and record "
    "only; nothing is carried out",
}
# The objects a page can be about: the selector that scopes them to the reader, and the field that names the
# cluster that governs each. A tenant reads the clusters it may know of (its own and the shared ones), its own
# jobs wherever they run, and the incidents on its clusters or that hit its jobs.
GOVERNED = {
    "cluster": ("fleet.selectors.cluster_catalog", "pk"),
    "node": ("fleet.selectors.node_list", "cluster_id"),
    "job": ("jobs.selectors.job_list", "cluster_id"),
    "incident": ("jobs.selectors.incident_list", "cluster_id"),
}


@dataclass(frozen=True)
class Banner:
    kind: str  # paused, dry-run or breaker
    title: str
    detail: str
    set_by: str
    set_at: datetime | None
    reason: str = ""


def governing_cluster(*, user, kind: str, pk) -> int | None:
    """The id of the cluster that governs the ``kind`` object ``pk`` (see ``GOVERNED``) if the user may see that
    object; None otherwise, or for a key that is no row's (not a number, out of range)."""
    if kind not in GOVERNED:
        return None
    try:
        pk = int(pk)
    except (TypeError, ValueError):
        return None
    if not 0 < pk < 2**63:  # no row has it, and the database would refuse to compare it
        return None
    selector, field = GOVERNED[kind]
    rows = import_string(selector)(user=user).prefetch_related(None).filter(pk=pk)
    return rows.values_list(field, flat=True).first()


def banners(*, user, cluster_id: int | None = None, fleets: bool = False) -> list[Banner]:
    """The holds that govern a page, as the user may read them: the provider switch always; with ``cluster_id``
    (from ``governing_cluster``), that cluster's, its fleet's and its fleet's breaker; with ``fleets`` (a page over
    the whole fleet, provider roles only), every fleet's own mode and breaker."""
    who = principal(user)
    if not who.is_authenticated:
        return []
    found = _provider_switch(who)
    if cluster_id is not None:
        cluster = Cluster.objects.select_related("fleet").filter(pk=cluster_id).first()
        if cluster is not None:
            found += _fleet_holds(who, cluster.fleet, cluster=cluster)
            if cluster.automation != AutomationMode.ACTIVE:
                found.append(_mode_banner(who, cluster, f"cluster {cluster.name}"))
    elif fleets and who.is_provider:
        for fleet in Fleet.objects.exclude(clusters=None).order_by("name"):
            found += _fleet_holds(who, fleet)
    return found


def _provider_switch(who) -> list[Banner]:
    row = (
        AutomationSwitch.objects.filter(pk=1)
        .values_list("mode", "reason", "changed_at", "changed_by__username")
        .first()
    )
    if row is None or row[0] == AutomationMode.ACTIVE:
        return []
    mode, reason, changed_at, username = row
    return [
        Banner(
            kind=mode,
            title=f"{WHAT[mode]} everywhere",
            detail=f"On every cluster, {EFFECT[mode]}.",
            set_by=(username or "the system") if who.is_provider else PROVIDER,
            set_at=changed_at,
            reason=reason if who.is_provider else "",
        )
    ]


def _fleet_holds(who, fleet: Fleet, *, cluster: Cluster | None = None) -> list[Banner]:
    # A tenant reads of the fleet only that it holds the cluster the page is about: not its name.
    name = f"fleet {fleet.name}" if who.is_provider else "this cluster's fleet"
    found = []
    if fleet.automation != AutomationMode.ACTIVE:
        found.append(_mode_banner(who, fleet, name))
    breaker = _breaker(who, fleet, name)
    if breaker is not None:
        found.append(breaker)
    return found


def _mode_banner(who, target: Fleet | Cluster, name: str) -> Banner:
    """A fleet's or a cluster's own mode; who set it and when from the last audit entry that changed it (or
    created the row with it)."""
    entry = (
        AuditEntry.objects.filter(object_type=target._meta.label_lower, object_id=str(target.pk))
        .filter(Q(changes__has_key="automation") | Q(action__endswith=".create"))
        .order_by("-created_at", "-id")
        .values_list("actor_name", "created_at")
        .first()
    )
    actor, at = entry if entry else (UNRECORDED, None)
    mode = target.automation
    return Banner(
        kind=mode,
        title=f"{WHAT[mode]} on {name}",
        detail=f"On {name}, {EFFECT[mode]}.",
        set_by=(actor or "the system") if who.is_provider else PROVIDER,
        set_at=at,
    )


def _breaker(who, fleet: Fleet, name: str) -> Banner | None:
    """The fleet's caps as the node services apply them (``fleet.services.nodes``): tripped when a cordon or a
    drain of a node in service would be refused now."""
    caps = _Caps(fleet)
    in_service = Node(state=NodeState.READY)
    refusals = [caps.refusal(in_service, state) for state in (NodeState.CORDONED, NodeState.DRAINING)]
    if not any(refusals):
        return None
    cordons, drains = (bool(refusal) for refusal in refusals)
    held = "new cordons and drains" if cordons and drains else "new cordons" if cordons else "new drains"
    node, actor, at = _tripped_by(fleet, caps)
    if who.is_provider:
        why = "; ".join(dict.fromkeys(refusal for refusal in refusals if refusal))
        set_by = f"{actor or 'the system'} ({node})" if node else "the fleet's caps"
        detail = f"{why[0].upper()}{why[1:]}. {held.capitalize()} are refused until nodes return to service."
    else:
        set_by = PROVIDER
        detail = f"{held.capitalize()} on {name} wait until nodes return to service."
    return Banner(
        kind="breaker", title=f"Circuit breaker tripped on {name}", detail=detail, set_by=set_by, set_at=at
    )


def _tripped_by(fleet: Fleet, caps: _Caps) -> tuple[str, str, datetime | None]:
    """The node whose cordon or drain reached the first cap that now holds (the share of the fleet, the cordon
    cap, the drain cap), who did it (its last audit entry) and when: ('', '', None) when none can be told."""
    allowance = share_allowance(fleet, caps.total)
    candidates = []
    if caps.disrupted >= allowance:
        candidates.append((DISRUPTED, allowance))
    if caps.disrupted >= fleet.max_cordoned_nodes:
        candidates.append((DISRUPTED, fleet.max_cordoned_nodes))
    if caps.draining >= fleet.max_draining_nodes:
        candidates.append(((NodeState.DRAINING,), fleet.max_draining_nodes))
    if not candidates:
        return "", "", None
    states, count = min(candidates, key=lambda candidate: candidate[1])
    if count < 1:  # a cap of none: no node's change tripped it
        return "", "", None
    rows = list(
        Node.objects.filter(cluster__fleet=fleet, state__in=states)
        .order_by("state_changed_at", "pk")
        .values_list("pk", "hostname", "state", "state_changed_at")[count - 1 : count]
    )
    if not rows:
        return "", "", None
    pk, hostname, state, changed_at = rows[0]
    actor = (
        AuditEntry.objects.filter(
            object_type=Node._meta.label_lower, object_id=str(pk), action__in=("node.cordon", "node.drain")
        )
        .order_by("-created_at", "-id")
        .values_list("actor_name", flat=True)
        .first()
    )
    verb = "drain" if state == NodeState.DRAINING else "cordon"
    return f"{verb} of {hostname}", actor or "", changed_at
