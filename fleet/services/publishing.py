"""Topics of fleet events: every change goes to ``fleet`` and to the ``cluster-<id>`` of each cluster it touches."""

from collections.abc import Iterable

from controlplane import events


def fleet_topics(cluster_ids: Iterable[int] = (), rollout_id: int | None = None) -> list[str]:
    names = [events.topic("fleet")]
    if rollout_id is not None:
        names.append(events.topic("rollout", rollout_id))
    names += [events.topic("cluster", cluster_id) for cluster_id in cluster_ids]
    return names


def publish(kind: str, payload: dict, url: str, *, clusters: Iterable[int] = (), rollout: int | None = None) -> None:
    events.publish(fleet_topics(clusters, rollout), kind, payload, url=url)
