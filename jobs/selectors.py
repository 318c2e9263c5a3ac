"""Reads of the jobs app; each takes the user it reads for (DESIGN's permission table)."""

import re
import statistics
from datetime import timedelta

from django.core.paginator import Page
from django.db.models import Count, F, Prefetch, Q, QuerySet, Sum, Value

from controlplane import events
from controlplane.access import PROVIDER_ROLES
from controlplane.pagination import OneMomentPaginator
from controlplane.selectors import event_list
from jobs.choices import (
    ACTIVE_ACTION_STATES,
    NODE_HARDWARE_KINDS,
    ActionState,
    JobPhaseKind,
    JobState,
    SavingState,
)
from jobs.models import (
    FaultEvent,
    Incident,
    Job,
    JobAllocation,
    JobPhase,
    JobSnapshot,
    LauncherCredential,
    NodeEscalation,
    RecoveryAction,
    SlurmJob,
)
from jobs.models.incidents import IncidentNote
from jobs.triage import catalogue, classify_xid
from tenancy.scoping import may_see, restrict, sees


def may_see_job_topic(who, job_id: int) -> bool:
    return may_see(who, Job, job_id)


def job_list(*, user) -> QuerySet[Job]:
    return restrict(Job.objects.select_related("tenant", "cluster"), user)


def running_jobs_on(*, user, cluster_ids) -> QuerySet[Job]:
    """The reader's running jobs on these clusters (a rollout preview's blast radius), by cluster, then name."""
    return (
        job_list(user=user)
        .filter(cluster_id__in=list(cluster_ids), state=JobState.RUNNING)
        .order_by("cluster_id", "name", "id")
    )


def launcher_credential_list(*, user) -> QuerySet[LauncherCredential]:
    """Launcher credentials are cluster credentials: provider roles only."""
    return restrict(LauncherCredential.objects.select_related("cluster"), user).order_by("-created_at", "-id")


def slurm_job_list(*, user) -> QuerySet[SlurmJob]:
    """The Slurm jobs Lockstep follows: tenant users see those of their jobs; those of unmapped accounts (no
    Lockstep job) only providers."""
    return restrict(SlurmJob.objects.select_related("job", "cluster"), user).order_by(
        "cluster_id", "-seen_at", "-id"
    )


def _hit_faults(user) -> Q:
    """The faults an action of one of the user's jobs names."""
    return Q(pk__in=action_list(user=user).filter(fault__isnull=False).values("fault_id"))


def _hit_incidents(user) -> QuerySet:
    """Ids of the incidents a recovery of one of the user's jobs answered."""
    return action_list(user=user).filter(incident__isnull=False).values("incident_id")


def fault_list(*, user) -> QuerySet[FaultEvent]:
    """Providers: every fault. Tenant users: faults on their dedicated clusters and faults that hit their jobs
    (an action of their job names the fault, or the fault is a report of an incident that hit their job)."""
    return restrict(
        FaultEvent.objects.select_related("node", "cluster"),
        user,
        also=_hit_faults(user) | Q(incident_id__in=_hit_incidents(user)),
    )


def job_fault_list(*, user) -> QuerySet[FaultEvent]:
    """The faults the GPU-hours figures count: every fault for provider roles; for tenant users those an
    action of one of their jobs names."""
    return restrict(fault_list(user=user), user, scope="actions__job__tenant_id", distinct=True)


def action_list(*, user) -> QuerySet[RecoveryAction]:
    """Providers: every action. Tenant users: the actions on their jobs."""
    return restrict(
        RecoveryAction.objects.select_related("job", "node", "to_node", "fault"), user, scope="job__tenant_id"
    )


def _incidents(user) -> QuerySet[Incident]:
    return restrict(
        Incident.objects.select_related("node", "cluster"), user, also=Q(pk__in=_hit_incidents(user))
    )


def incident_list(*, user, actions: QuerySet[RecoveryAction] | None = None) -> QuerySet[Incident]:
    """Incidents scoped as faults are: providers see every one; tenant users those on their dedicated clusters
    and those that hit their jobs. Each comes with its faults (the reports the user may see, oldest first) and,
    given ``actions`` (a queryset of ``action_list``), with those of its actions."""
    rows = _incidents(user).prefetch_related(
        Prefetch("faults", queryset=fault_list(user=user).order_by("detected_at", "id"))
    )
    if actions is not None:
        rows = rows.prefetch_related(Prefetch("actions", queryset=actions.order_by("planned_at", "id")))
    return rows


def sources_of(incident: Incident) -> list[str]:
    """Every source that reported an incident (the union of its prefetched faults' sources), sorted."""
    return sorted({source for fault in incident.faults.all() for source in fault.sources})


def job_incidents(*, user, job: Job, limit: int = 50) -> list[Incident]:
    """The incidents that hit a job (through its recovery actions), newest first, each with its reports, its
    sources and the job's recovery attempts for it."""
    attempts = action_list(user=user).filter(job=job)
    rows = incident_list(user=user, actions=attempts).filter(
        pk__in=RecoveryAction.objects.filter(job=job, incident__isnull=False).values("incident_id")
    )
    found = list(rows[:limit])
    for incident in found:
        incident.sources = sources_of(incident)
    return found


def _feed_rows(user, cluster) -> tuple[QuerySet[FaultEvent], QuerySet[Incident]]:
    """What the fault feed holds: faults of no incident and incidents, the fleet's for provider roles, those that
    hit the tenant's jobs otherwise; one cluster's if ``cluster`` is given."""
    faults = restrict(fault_list(user=user).filter(incident__isnull=True), user, scope=_hit_faults(user))
    incidents = restrict(incident_list(user=user), user, scope=Q(pk__in=_hit_incidents(user)))
    if cluster is not None:
        faults, incidents = faults.filter(cluster=cluster), incidents.filter(cluster=cluster)
    return faults, incidents


def fault_feed(*, user, cluster=None, page: int = 1, per_page: int = 50) -> tuple[Page, list[dict]]:
    """One page of the fault feed, newest first: one row per incident (``{"at", "incident"}``, its reports folded
    under it) and one per fault of no incident (``{"at", "fault"}``, with the recoveries of it the user may see),
    scoped as ``_feed_rows`` says. Raises ``InvalidPage`` for a page that is not there (page 1 always is)."""
    faults, incidents = _feed_rows(user, cluster)
    keys = (
        incidents.order_by()
        .annotate(row_kind=Value("incident"), at=F("last_reported_at"))
        .values_list("row_kind", "id", "at")
        .union(
            faults.order_by()
            .annotate(row_kind=Value("fault"), at=F("received_at"))
            .values_list("row_kind", "id", "at"),
            all=True,
        )
        .order_by("-at", "-id")
    )
    found = OneMomentPaginator(keys, per_page, allow_empty_first_page=True).page(page)
    wanted = {
        "incident": [pk for kind, pk, _ in found.object_list if kind == "incident"],
        "fault": [pk for kind, pk, _ in found.object_list if kind == "fault"],
    }
    loaded = {("incident", row.pk): row for row in incidents.filter(pk__in=wanted["incident"])}
    loaded |= {
        ("fault", row.pk): row
        for row in faults.filter(pk__in=wanted["fault"]).prefetch_related(
            Prefetch("actions", queryset=action_list(user=user).order_by("planned_at", "id"))
        )
    }
    rows = []
    for kind, pk, at in found.object_list:
        row = loaded.get((kind, pk))
        if row is None:  # gone between the page and the read
            continue
        if kind == "incident":
            row.sources = sources_of(row)
        rows.append({"at": at, kind: row})
    return found, rows


def visible_node_ids(*, user, node_ids) -> set[int]:
    """Of these nodes, those the user may open (``fleet.selectors.node_list``): what a page may link to."""
    from fleet.selectors import node_list

    ids = {pk for pk in node_ids if pk is not None}
    if not ids:
        return set()
    return set(node_list(user=user).filter(pk__in=ids).values_list("pk", flat=True))


def node_allocations(*, user, node) -> QuerySet[JobAllocation]:
    """The jobs' places on a node, the current ones first, then the past ones newest first: every job's for
    provider roles, the tenant's own jobs' otherwise."""
    return restrict(JobAllocation.objects.filter(node=node).select_related("job__tenant"), user).order_by(
        F("released_at").desc(nulls_first=True), "-created_at", "-id"
    )


def job_allocations(*, user, job: Job) -> QuerySet[JobAllocation]:
    """Where a job runs and ran: its allocations, current ones first (by rank), then past ones newest first."""
    return restrict(JobAllocation.objects.filter(job=job).select_related("node"), user).order_by(
        F("released_at").desc(nulls_first=True), "rank_start", "-id"
    )


def node_faults(*, user, node, limit: int = 100) -> list[FaultEvent]:
    """The newest faults of a node the user may see, each with its incident and the recoveries of it the user
    may see."""
    return list(
        fault_list(user=user)
        .filter(node=node)
        .select_related("incident")
        .prefetch_related(Prefetch("actions", queryset=action_list(user=user).order_by("planned_at", "id")))
        .order_by("-detected_at", "-id")[:limit]
    )


def node_ladder(*, user, node, limit: int = 100) -> dict:
    """A node's escalation ladder: where it stands (``escalation``, or None), its steps as the cluster's event
    log recorded them (``history``, newest first; only for a reader of the cluster's topic) and the node-level
    recovery actions of the ladder the user may see (``steps``)."""
    history = (
        event_list(user=user, topic=events.topic("cluster", node.cluster_id))
        .filter(kind="node.escalation", payload__node=node.pk)
        .order_by("-seq")[:limit]
    )
    return {
        "escalation": restrict(NodeEscalation.objects.filter(node=node), user).first(),
        "history": list(history),
        "steps": list(
            action_list(user=user).filter(node=node, job__isnull=True).order_by("-planned_at", "-id")[:limit]
        ),
    }


def incident_actions(*, user, incident: Incident) -> list[RecoveryAction]:
    """The recoveries of an incident the user may see (tenant users: their jobs'), oldest first."""
    return list(
        action_list(user=user)
        .filter(incident=incident)
        .select_related("job__tenant", "previous")
        .order_by("planned_at", "id")
    )


SEARCH_LIMIT = 20
SEARCH_MAX_LENGTH = 100
INCIDENT_NUMBER = re.compile(r"^(?:incident\s*)?#?(\d{1,12})$", re.IGNORECASE)


SEARCH_GROUPS = (("clusters", "Clusters"), ("nodes", "Nodes"), ("jobs", "Jobs"), ("incidents", "Incidents"))


def search(*, user, q: str, limit: int = SEARCH_LIMIT) -> list[dict]:
    """What ``q`` finds among what the user may see: clusters by name, nodes by hostname, jobs by name (or id)
    and incidents by number (``12``, ``#12``, ``incident 12``), kind or their node's hostname. One group each
    (``{"name", "label", "rows", "more"}``): at most ``limit`` rows, newest jobs and incidents first, ``more``
    when there are others. The caller has checked ``q`` (not empty, at most ``SEARCH_MAX_LENGTH`` characters,
    no NUL)."""
    from fleet.selectors import cluster_list, node_list

    number = INCIDENT_NUMBER.match(q)
    job_match = Q(name__icontains=q) | (Q(pk=int(number[1])) if number else Q(pk__in=[]))
    incident_match = Q(kind__icontains=q) | Q(node__hostname__icontains=q)
    if number:
        incident_match |= Q(pk=int(number[1]))
    found = {
        "clusters": cluster_list(user=user).filter(name__icontains=q).order_by("name"),
        "nodes": node_list(user=user).filter(hostname__icontains=q).order_by("hostname", "pk"),
        "jobs": job_list(user=user).filter(job_match).order_by("-created_at", "-id"),
        "incidents": _incidents(user).filter(incident_match).order_by("-opened_at", "-id"),
    }
    groups = []
    for name, label in SEARCH_GROUPS:
        rows = list(found[name][: limit + 1])  # one more than shown: whether there are others
        groups.append({"name": name, "label": label, "rows": rows[:limit], "more": len(rows) > limit})
    return groups


def sees_decisions(*, user, incident: Incident) -> bool:
    """Whether the user may read the stay decisions recorded on an incident's faults: a decision weighs the jobs
    the fault hit, which on a shared cluster may be another tenant's, so tenant users read them on their own
    clusters only."""
    return sees(user, incident)


def snapshot_list(*, user, job: Job) -> QuerySet[JobSnapshot]:
    return restrict(JobSnapshot.objects.filter(job=job), user)


def _application_xids() -> list[int]:
    """Xid codes the catalogue calls application errors (the tenant's code, not the node): the gate skips them."""
    rows = catalogue()
    verdicts = (classify_xid(code, rows) for code in rows)
    return sorted(v.xid for v in verdicts if v.application and not v.escalates)


def hardware_fault_count(cluster_ids: list[int], since, until) -> int:
    """fleet.hooks fault counter for the rollout gate: hardware faults a node-level change can cause
    (``NODE_HARDWARE_KINDS``, less application Xids) detected on these clusters' nodes in [since, until), one per
    incident (the agent's Xid 79 and Alertmanager's NodeDown of one failure count once)."""
    rows = FaultEvent.objects.filter(
        cluster_id__in=cluster_ids,
        detected_at__gte=since,
        detected_at__lt=until,
        kind__in=NODE_HARDWARE_KINDS,
    ).exclude(kind="gpu_xid", xid__in=_application_xids())
    counts = rows.aggregate(
        incidents=Count("incident", distinct=True), loose=Count("pk", filter=Q(incident__isnull=True))
    )
    return counts["incidents"] + counts["loose"]


# The landing pages' reads (home/views.py): faults and recoveries on the provider's dashboard, a tenant's jobs.


def _booked_since(actions: QuerySet[RecoveryAction], since) -> tuple[float, float]:
    """GPU-hours saved (realized) and lost by the recoveries booked since ``since`` (docs/gpu-hours.md)."""
    row = actions.filter(state=ActionState.SUCCEEDED, dry_run=False, ended_at__gte=since).aggregate(
        saved=Sum("gpu_hours_saved"), lost=Sum("gpu_hours_lost")
    )
    return round(row["saved"] or 0.0, 2), round(row["lost"] or 0.0, 2)


def expected_saving(actions: QuerySet[RecoveryAction]) -> float:
    """What unsettled proactive moves expect to save (kept apart from the realized figure; docs/gpu-hours.md)."""

    value = actions.filter(state=ActionState.SUCCEEDED, dry_run=False, saving=SavingState.EXPECTED).aggregate(
        s=Sum("gpu_hours_expected")
    )["s"]
    return round(value or 0.0, 2)


def recovery_dashboard(*, user, now, since, truncate) -> dict:
    """The dashboard's fault and GPU-hours figures, and its two series over [since, now]: faults per bucket
    (``truncate`` is the Trunc function of the bucket) and GPU-hours saved, cumulated."""
    faults = restrict(FaultEvent.objects.all(), user)
    actions = restrict(RecoveryAction.objects.all(), user)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    per_bucket = (
        faults.filter(received_at__gte=since)
        .annotate(hour=truncate("received_at"))
        .values("hour")
        .annotate(n=Count("id"))
        .order_by("hour")
    )
    booked_buckets = (
        actions.filter(state=ActionState.SUCCEEDED, dry_run=False, ended_at__gte=since)
        .annotate(hour=truncate("ended_at"))
        .values("hour")
        .annotate(saved=Sum("gpu_hours_saved"), lost=Sum("gpu_hours_lost"))
        .order_by("hour")
    )
    saved, lost, saved_series, lost_series = 0.0, 0.0, [], []
    for row in booked_buckets:
        saved += row["saved"] or 0.0
        lost += row["lost"] or 0.0
        saved_series.append({"t": row["hour"].isoformat(), "v": round(saved, 3)})
        lost_series.append({"t": row["hour"].isoformat(), "v": round(lost, 3)})
    saved_today, lost_today = _booked_since(actions, today)
    saved_30d, lost_30d = _booked_since(actions, now - timedelta(days=30))
    return {
        "figures": {
            "faults_24h": faults.filter(received_at__gte=now - timedelta(hours=24)).count(),
            "faults_open": faults.filter(state="new").count(),
            "saved_today": saved_today,
            "saved_30d": saved_30d,
            "lost_today": lost_today,
            "lost_30d": lost_30d,
            "expected": expected_saving(actions),
        },
        "faults": [{"t": r["hour"].isoformat(), "v": r["n"]} for r in per_bucket],
        "saved": saved_series,
        "lost": lost_series,
    }


def first_fault_at(*, user):
    """When the first fault the user may see was received (the first stored: ids follow arrival), or None: where
    the fleet's charts begin (controlplane.timerange.fitting)."""
    first = restrict(FaultEvent.objects.all(), user).order_by("pk").values_list("received_at", flat=True)[:1]
    return next(iter(first), None)


def realized_saving() -> Sum:
    """A job's GPU-hours saved by its recoveries that happened (succeeded, not dry runs), for ``annotate``."""
    return Sum(
        "actions__gpu_hours_saved", filter=Q(actions__state=ActionState.SUCCEEDED, actions__dry_run=False)
    )


def booked_loss() -> Sum:
    """A job's GPU-hours lost in the recoveries that saved ``realized_saving`` (the same actions), for
    ``annotate``."""
    return Sum(
        "actions__gpu_hours_lost", filter=Q(actions__state=ActionState.SUCCEEDED, actions__dry_run=False)
    )


def tenant_recent_jobs(*, user, tenant_id: int, limit: int = 100) -> list[Job]:
    """A tenant's newest jobs, each with the GPU-hours its recoveries saved (``saved``) and lost (``lost``)."""

    return list(
        restrict(Job.objects.filter(tenant_id=tenant_id), user)
        .select_related("cluster__blueprint_version__blueprint")
        .annotate(saved=realized_saving(), lost=booked_loss())
        .order_by("-created_at")[:limit]
    )


def tenant_phase_seconds(*, user, tenant_id: int, since, now) -> dict[str, float]:
    """Seconds the tenant's jobs spent in each phase kind between ``since`` and ``now``: phases still open count
    up to now, and one that began before ``since`` counts from ``since``. Closed phases inside the window are one
    aggregate; the few that are open or straddle its start (about one per job) are added here."""
    phases = restrict(JobPhase.objects.filter(job__tenant_id=tenant_id), user)
    inside = (
        phases.filter(started_at__gte=since, ended_at__isnull=False)
        .values("kind")
        .annotate(seconds=Sum(F("ended_at") - F("started_at")))
        .order_by()
    )
    totals = {row["kind"]: (row["seconds"].total_seconds() if row["seconds"] else 0.0) for row in inside}
    edges = phases.filter(Q(ended_at__isnull=True) | Q(started_at__lt=since, ended_at__gt=since)).values_list(
        "kind", "started_at", "ended_at"
    )
    for kind, started_at, ended_at in edges:
        seconds = (min(ended_at or now, now) - max(started_at, since)).total_seconds()
        if seconds > 0:
            totals[kind] = totals.get(kind, 0.0) + seconds
    return totals


def tenant_recovery_figures(*, user, tenant_id: int) -> dict:
    """A tenant's jobs recovering now, and the GPU-hours its recoveries saved, lost and expect to save."""
    actions = restrict(RecoveryAction.objects.filter(job__tenant_id=tenant_id), user)
    booked = actions.filter(state=ActionState.SUCCEEDED, dry_run=False).aggregate(
        saved=Sum("gpu_hours_saved"), lost=Sum("gpu_hours_lost")
    )
    recovering = restrict(
        JobPhase.objects.filter(
            job__tenant_id=tenant_id, kind=JobPhaseKind.RECOVERING, ended_at__isnull=True
        ),
        user,
    ).count()
    return {
        "saved": round(booked["saved"] or 0.0, 2),
        "lost": round(booked["lost"] or 0.0, 2),
        "expected": expected_saving(actions),
        "recovering_now": recovering,
    }


def node_drain(*, user, node) -> dict | None:
    """What a draining node's drain waits for (``jobs.services.drain.drain_waits``), its jobs limited to those the
    user may see; None when the node is not draining."""
    from jobs.services.drain import drain_waits

    status = drain_waits(node)
    if status is None:
        return None
    visible = set(
        restrict(Job.objects.filter(pk__in=[wait["job"].pk for wait in status["waits"]]), user).values_list(
            "pk", flat=True
        )
    )
    hidden = sum(wait["job"].pk not in visible for wait in status["waits"])
    return {
        **status,
        "waits": [wait for wait in status["waits"] if wait["job"].pk in visible],
        "hidden": hidden,
    }


# --- incidents as on-call work (jobs.services.incident_work) ----------------------------------------------------

INCIDENT_MEASURES = ("acknowledge", "recover", "resolve")


def incident_work_list(*, user) -> QuerySet[Incident]:
    """The incident list page's rows: ``incident_list``'s scope, with who works each."""
    return _incidents(user).select_related("assignee")


def incident_tenant_ids(incident: Incident) -> set[int]:
    """The tenants whose users see an incident: its cluster's dedicated tenant and the tenants of the jobs it hit."""
    ids = set(
        RecoveryAction.objects.filter(incident=incident, job__isnull=False).values_list(
            "job__tenant_id", flat=True
        )
    )
    if incident.cluster.dedicated_tenant_id:
        ids.add(incident.cluster.dedicated_tenant_id)
    return ids


def incident_assignees(*, incident: Incident) -> QuerySet:
    """Who an incident may be assigned to: the active users who may see it (provider roles, and the users of the
    tenants that see it), by name."""
    from django.contrib.auth import get_user_model

    sees_it = (
        Q(membership__role__in=sorted(PROVIDER_ROLES))
        | Q(membership__tenant_id__in=incident_tenant_ids(incident))
        | Q(is_superuser=True, membership__isnull=True)
    )
    return get_user_model().objects.filter(sees_it, is_active=True).order_by("username")


def incident_notes(*, user, incident: Incident) -> QuerySet[IncidentNote]:
    """An incident's notes the user may read, oldest first: every one for provider roles; a tenant user's own
    tenant's and the provider's (a provider note is for everyone who sees the incident)."""
    rows = IncidentNote.objects.filter(incident=incident).select_related("author")
    return restrict(rows, user, also=Q(tenant__isnull=True))


def incident_recovering(*, incident: Incident) -> bool:
    """Whether a recovery of the incident is still under way (decided, not ended, not a dry run)."""
    return RecoveryAction.objects.filter(
        incident=incident, dry_run=False, state__in=ACTIVE_ACTION_STATES
    ).exists()


def _since_opened(opened_at, at) -> float | None:
    return max(0.0, (at - opened_at).total_seconds()) if at is not None else None


def incident_times(incident: Incident) -> dict[str, float | None]:
    """Seconds from an incident's first report until a person acknowledged it, until it recovered (the fault path
    closed it: its reports stopped and every recovery of it ended) and until a person resolved it; None where
    that has not happened."""
    return {
        "acknowledge": _since_opened(incident.opened_at, incident.acknowledged_at),
        "recover": _since_opened(incident.opened_at, incident.resolved_at),
        "resolve": _since_opened(incident.opened_at, incident.closed_at),
    }


def _medians(rows) -> dict:
    """Medians of each measure over ``rows`` of (cluster id, cluster name, opened, acknowledged, recovered,
    resolved): the fleet's and each cluster's, with how many incidents each counts."""
    fleet: dict[str, list[float]] = {m: [] for m in INCIDENT_MEASURES}
    clusters: dict[int, dict] = {}
    for cluster_id, name, opened, *ends in rows:
        entry = clusters.setdefault(cluster_id, {"id": cluster_id, "name": name, "incidents": 0})
        entry["incidents"] += 1
        for measure, at in zip(INCIDENT_MEASURES, ends, strict=True):
            seconds = _since_opened(opened, at)
            if seconds is not None:
                fleet[measure].append(seconds)
                entry.setdefault(measure, []).append(seconds)

    def summary(values: dict, n: int) -> dict:
        found = {m: statistics.median(values[m]) if values.get(m) else None for m in INCIDENT_MEASURES}
        return {**found, "incidents": n}

    return {
        "fleet": summary(fleet, len(rows)),
        "clusters": [
            {"id": entry["id"], "name": entry["name"], **summary(entry, entry["incidents"])}
            for entry in sorted(clusters.values(), key=lambda e: e["name"])
        ],
    }


MEDIAN_FIELDS = ("cluster_id", "cluster__name", "opened_at", "acknowledged_at", "resolved_at", "closed_at")


def incident_medians(*, user, since) -> dict:
    """Median time to acknowledge, to recover and to resolve of the incidents the user sees opened since
    ``since``: the fleet's and each cluster's (``_medians``)."""
    return _medians(
        list(_incidents(user).filter(opened_at__gte=since).order_by().values_list(*MEDIAN_FIELDS))
    )


def fleet_incident_medians(*, since) -> dict:
    """``incident_medians`` of every incident, for /metrics (which only provider roles read)."""
    return _medians(
        list(Incident.objects.filter(opened_at__gte=since).order_by().values_list(*MEDIAN_FIELDS))
    )
