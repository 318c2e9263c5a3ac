"""Differences drift detection ignores (ignore rules of a version's add-ons and policy), shown on request."""

from fleet.desired import compare, desired_state, load_versions
from fleet.drivers.base import ObservedState
from fleet.models import ObservedAddon
from fleet.overlays import load_overlays, with_overlays
from fleet.selectors import cluster_list


def ignored_differences(*, user, cluster_id: int | None = None, limit: int = 500) -> list[dict]:
    """``[{"cluster", "name", "addon", "ignored": [diff…]}]`` for the clusters the user sees in full: what their
    add-ons' ignore rules silence, compared from the last observation (no driver is asked)."""
    clusters = cluster_list(user=user).filter(blueprint_version__isnull=False).order_by("name")
    if cluster_id is not None:
        clusters = clusters.filter(pk=cluster_id)
    clusters = list(clusters[:limit])
    versions = load_versions({c.blueprint_version_id for c in clusters})
    overlays = load_overlays({v.blueprint_id for v in versions.values()})
    observed: dict[int, list[ObservedState]] = {c.pk: [] for c in clusters}
    for row in ObservedAddon.objects.filter(cluster_id__in=list(observed)):
        observed[row.cluster_id].append(
            ObservedState(
                name=row.name,
                chart=row.chart,
                version=row.version,
                namespace=row.namespace,
                values=row.values,
                health=row.health,
            )
        )
    found = []
    for cluster in clusters:
        version = versions[cluster.blueprint_version_id]
        desired = with_overlays(desired_state(version), cluster, overlays.get(version.blueprint_id))
        for check in compare(desired, observed[cluster.pk]):
            if check.ignored:
                found.append(
                    {
                        "cluster": cluster.pk,
                        "name": cluster.name,
                        "addon": check.name,
                        "ignored": check.ignored,
                    }
                )
    return found
