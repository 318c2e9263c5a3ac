"""Evidence that a link is healthy again, from the NIC counters ingest folds (``NICState.errors_at``): jobs asks
for it through ``jobs.hooks`` to fail jobs back (jobs.services.links)."""

from datetime import datetime, timedelta

from telemetry.models import NICState


def links_clean(
    links: dict[tuple[int, str], datetime], *, window: timedelta, now: datetime
) -> dict[tuple[int, str], bool]:
    """For each link ``(node id, NIC name) → since`` (when it was last known bad): True when the agent's readings show
    it up with no new error for ``window`` after both ``since`` and its last error, and the latest reading is fresh
    (within ``window``); False when the readings show otherwise. A link with no telemetry is left out."""
    if not links:
        return {}
    found = {}
    rows = NICState.objects.filter(nic__node_id__in={node for node, _ in links}).values_list(
        "nic__node_id", "nic__name", "link_state", "ts", "errors_at"
    )
    for node_id, name, state, ts, errors_at in rows:
        since = links.get((node_id, name))
        if since is None:
            continue
        last_bad = max(since, errors_at) if errors_at else since
        found[node_id, name] = state == "up" and ts - last_bad >= window and now - ts <= window
    return found
