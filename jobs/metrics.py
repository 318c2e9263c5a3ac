"""/metrics: incidents as on-call work, read from the database at scrape time (telemetry/metrics.py serves it).

Incidents by work state, and the median time to acknowledge, to recover and to resolve over the last 30 days,
fleet-wide and per cluster (a median of no incident is left out rather than written as 0)."""

from datetime import timedelta

from django.db.models import Count
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from jobs.models import Incident
from jobs.models.incidents import IncidentWork
from jobs.selectors import INCIDENT_MEASURES, fleet_incident_medians

MEDIAN_DAYS = 30


class IncidentWorkCollector:
    def collect(self):
        counts = {value: 0 for value in IncidentWork.values}  # every state, 0 where none is in it
        counts.update(
            Incident.objects.values_list("work_state").annotate(n=Count("pk")).order_by("work_state")
        )
        incidents = GaugeMetricFamily(
            "lockstep_incidents", "Incidents by on-call work state", labels=["work_state"]
        )
        for state, n in sorted(counts.items()):
            incidents.add_metric([state], n)
        yield incidents

        medians = fleet_incident_medians(since=timezone.now() - timedelta(days=MEDIAN_DAYS))
        fleet = GaugeMetricFamily(
            "lockstep_incident_median_seconds",
            f"Median seconds from an incident's first report to each step, fleet-wide, over {MEDIAN_DAYS} days",
            labels=["measure"],
        )
        per_cluster = GaugeMetricFamily(
            "lockstep_cluster_incident_median_seconds",
            f"Median seconds from an incident's first report to each step, per cluster, over {MEDIAN_DAYS} days",
            labels=["cluster", "measure"],
        )
        for measure in INCIDENT_MEASURES:
            if medians["fleet"][measure] is not None:
                fleet.add_metric([measure], medians["fleet"][measure])
            for row in medians["clusters"]:
                if row[measure] is not None:
                    per_cluster.add_metric([row["name"], measure], row[measure])
        yield fleet
        yield per_cluster
