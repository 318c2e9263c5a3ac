"""Topics of fleet events: every change goes to ``fleet`` and to the ``cluster-<id>`` of each cluster it touches.

A service that publishes many events in one transaction (a rollout step, a sweep, a rollback) wraps its work in
``batched()``: events are then written at the end, topic by topic in sorted name order — the one global order in
which every publisher takes topic sequence rows — so two publishing transactions never wait on each other in a
cycle. Within a topic, events keep the order they were published in.
"""

import contextvars
from collections.abc import Iterable
from contextlib import contextmanager

from controlplane import events

_batch: contextvars.ContextVar[list | None] = contextvars.ContextVar("fleet_event_batch", default=None)


def fleet_topics(cluster_ids: Iterable[int] = (), rollout_id: int | None = None) -> list[str]:
    names = [events.topic("fleet")]
    if rollout_id is not None:
        names.append(events.topic("rollout", rollout_id))
    names += [events.topic("cluster", cluster_id) for cluster_id in cluster_ids]
    return names


def publish(
    kind: str, payload: dict, url: str, *, clusters: Iterable[int] = (), rollout: int | None = None
) -> None:
    publish_topics(fleet_topics(clusters, rollout), kind, payload, url)


def publish_topics(topics: list[str], kind: str, payload: dict, url: str) -> None:
    """Publish now, or at the end of the enclosing ``batched()`` block."""
    batch = _batch.get()
    if batch is None:
        events.publish(topics, kind, payload, url=url)
    else:
        batch.append((list(topics), kind, payload, url))


@contextmanager
def batched():
    """Collect the events published inside; write them, in global topic order, when the block succeeds."""
    if _batch.get() is not None:  # already batching: the outer block writes them
        yield
        return
    batch: list = []
    token = _batch.set(batch)
    try:
        yield
    finally:
        _batch.reset(token)
    entries = [
        (name, i, kind, payload, url)
        for i, (topics, kind, payload, url) in enumerate(batch)
        for name in dict.fromkeys(topics)
    ]
    for name, _, kind, payload, url in sorted(entries, key=lambda entry: (entry[0], entry[1])):
        events.publish([name], kind, payload, url=url)
