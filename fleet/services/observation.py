"""Observing clusters through their drivers, batched per driver class, and recording what was seen."""

import logging
from collections import defaultdict

from controlplane.bulk import update_rows
from fleet.choices import HealthStatus, SyncStatus
from fleet.desired import AddonCheck
from fleet.drivers import DriverError
from fleet.drivers.base import ObservedState, driver_class
from fleet.models import Cluster, ObservedAddon

log = logging.getLogger(__name__)


def observe(clusters) -> tuple[dict[int, list[ObservedState]], dict[int, str]]:
    """``(observed by cluster id, error by cluster id)``: one ``observe_many`` per driver class; when a batch
    fails, its clusters are observed one by one so one unreachable cluster does not blind the sweep."""
    by_driver = defaultdict(list)
    for cluster in clusters:
        by_driver[cluster.driver].append(cluster)
    observed: dict[int, list[ObservedState]] = {}
    errors: dict[int, str] = {}
    for name, group in by_driver.items():
        cls = driver_class(name)
        try:
            observed.update(cls.observe_many(group))
            continue
        except Exception:  # whatever the batch raised, each cluster is asked on its own below
            pass
        for cluster in group:
            try:
                observed.update(cls.observe_many([cluster]))
            except DriverError as error:
                errors[cluster.pk] = str(error)[:300]
            except Exception as error:  # a driver's bug, or an error it did not translate
                # One cluster's failure stays that cluster's: it is Unknown with the reason, the others are observed.
                log.exception("observing cluster %s failed", cluster.pk)
                errors[cluster.pk] = f"the {name} driver failed: {type(error).__name__}"
    return observed, errors


def record(checks: dict[int, list[AddonCheck]], errors: dict[int, str], now) -> int:
    """Write the observed axes of every add-on of these clusters in a fixed number of queries; returns rows written.

    Only rows whose content changed are written (their ``observed_at`` is when they changed); every reachable
    cluster's ``last_observed_at`` is set (and its ``observation_error`` cleared) in one UPDATE; unreachable
    clusters' (``errors``: cluster id → why) rows become Unknown on both axes and each keeps its reason.
    """
    unreachable = set(errors)
    cluster_ids = set(checks) | unreachable
    existing = {
        (row["cluster_id"], row["name"]): row
        for row in ObservedAddon.objects.filter(cluster_id__in=cluster_ids).values(
            "id", "cluster_id", "name", "chart", "version", "namespace", "values", "sync", "health", "message"
        )
    }
    upserts, keep = [], set()
    for cluster_id, cluster_checks in checks.items():
        for check in cluster_checks:
            have, want = check.observed, check.desired or {}
            row = {
                "chart": have.chart if have else want.get("chart", ""),
                "version": have.version if have else "",
                "namespace": have.namespace if have else want.get("namespace", ""),
                "values": have.values if have else {},
                "sync": check.sync,
                "health": check.health,
                "message": (have.message if have else "")[:500],
            }
            keep.add((cluster_id, check.name))
            old = existing.get((cluster_id, check.name))
            if old is None or any(old[key] != value for key, value in row.items()):
                upserts.append(ObservedAddon(cluster_id=cluster_id, name=check.name, observed_at=now, **row))
    if upserts:
        ObservedAddon.objects.bulk_create(
            upserts,
            update_conflicts=True,
            unique_fields=["cluster", "name"],
            update_fields=[
                "chart",
                "version",
                "namespace",
                "values",
                "sync",
                "health",
                "message",
                "observed_at",
            ],
        )
    gone = [row["id"] for key, row in existing.items() if key[0] in checks and key not in keep]
    if gone:
        ObservedAddon.objects.filter(pk__in=gone).delete()
    if checks:
        Cluster.objects.filter(pk__in=list(checks)).update(last_observed_at=now, observation_error="")
    if unreachable:
        ObservedAddon.objects.filter(cluster_id__in=unreachable).update(
            sync=SyncStatus.UNKNOWN, health=HealthStatus.UNKNOWN, observed_at=now
        )
        update_rows(
            [Cluster(pk=pk, observation_error=why[:300]) for pk, why in errors.items()], ["observation_error"]
        )
    return len(upserts)
