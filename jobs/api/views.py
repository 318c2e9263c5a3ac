"""The jobs API: jobs, incidents, faults, recovery actions and stats; each action calls one service or selector."""

from datetime import timedelta

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, mixins, serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.access import require
from controlplane.api import ScopedViewSet, represented, validated
from controlplane.openapi import ErrorSerializer
from controlplane.timerange import RANGES
from fleet import selectors as fleet_selectors
from fleet.models import Node
from jobs import figures, selectors
from jobs.api.serializers import (
    FaultReportSerializer,
    FaultSerializer,
    IncidentAssignSerializer,
    IncidentDetailSerializer,
    IncidentNoteCreateSerializer,
    IncidentNoteSerializer,
    IncidentResolveSerializer,
    IncidentSerializer,
    IncidentWorkSerializer,
    JobSerializer,
    JobSubmitSerializer,
    ProgressSerializer,
    RecoveryActionSerializer,
    SnapshotReportSerializer,
    SnapshotSerializer,
)
from jobs.authentication import JobTokenAuthentication
from jobs.filtersets import FaultEventFilterSet, IncidentFilterSet, JobFilterSet, RecoveryActionFilterSet
from jobs.models import JobToken
from jobs.services import faults as fault_services
from jobs.services import incident_work
from jobs.services import jobs as job_services
from jobs.services.escalation import escalation_repaired
from jobs.services.snapshots import snapshot_report, snapshot_take
from tenancy.authentication import BearerTokenAuthentication
from tenancy.selectors import tenant_list


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Training jobs. Submit on a simulated cluster (Lockstep places it) or register a job that runs on a real
    cluster (name its hosts); the answer carries the job token, shown once, for ``progress/``."""

    serializer_class = JobSerializer
    filterset_class = JobFilterSet

    def selector(self, *, user):
        return selectors.job_list(user=user).prefetch_related("allocations__node", "standbys__node")

    def get_authenticators(self):
        # progress/ and snapshots/ also take the job's own token; everything else the usual bearer and session.
        request = getattr(self, "request", None)  # None while drf-spectacular builds the schema
        if getattr(self, "action", None) in ("progress", "snapshots") or (
            request is not None and request.path.endswith(("/progress/", "/snapshots/"))
        ):
            return [JobTokenAuthentication(), BearerTokenAuthentication(), SessionAuthentication()]
        return super().get_authenticators()

    @extend_schema(request=JobSubmitSerializer, responses=JobSerializer)
    def create(self, request):
        who = self.principal
        require(who.may_submit_jobs(who.tenant_id), "you may not submit jobs")  # before reading any input
        data = JobSubmitSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        if who.is_provider:
            if "tenant" not in values:
                raise exceptions.ValidationError(
                    {"tenant": ["provider roles name the tenant the job runs for"]}
                )
            tenant = tenant_list(user=request.user).filter(pk=values["tenant"]).first()
            if tenant is None:
                raise exceptions.ValidationError({"tenant": ["no such tenant"]})
        else:
            tenant = (
                get_object_or_404(tenant_list(user=request.user), pk=who.tenant_id) if who.tenant_id else None
            )
        require(
            tenant is not None and who.may_submit_jobs(tenant.pk), "you may not submit jobs for this tenant"
        )
        # One the user may put the tenant's jobs on; any other id, existing or not, gets the same answer.
        cluster = (
            fleet_selectors.job_clusters(user=request.user, tenant_id=tenant.pk)
            .filter(pk=values["cluster"])
            .first()
        )
        if cluster is None:
            raise exceptions.ValidationError({"cluster": [job_services.NO_SUCH_CLUSTER]})
        # Naming hosts claims them: on a shared cluster only provider roles (or the cluster's launcher) may.
        require(
            not values.get("hostnames") or who.is_provider or cluster.dedicated_tenant_id == tenant.pk,
            "only provider roles register jobs on named hosts of a shared cluster",
        )
        job, token = job_services.job_submit(
            actor=request.user,
            tenant=tenant,
            cluster=cluster,
            name=values["name"],
            gpus=values["gpus"],
            gpus_per_node=values["gpus_per_node"],
            seconds_per_iteration=values["seconds_per_iteration"],
            checkpoint_interval=values["checkpoint_interval"],
            total_iterations=values.get("total_iterations"),
            hostnames=values.get("hostnames"),
            gpu_model=values.get("gpu_model"),
        )
        body = JobSerializer(
            selectors.job_list(user=request.user).prefetch_related("allocations__node").get(pk=job.pk),
            context={},
        ).data
        return Response({**body, "token": token}, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = self.get_object()
        require(self.principal.may_submit_jobs(job.tenant_id), "you may not cancel this job")
        job = job_services.job_cancel(actor=request.user, job=job)
        return Response(JobSerializer(job, context={}).data)

    @extend_schema(
        request=ProgressSerializer,
        responses=inline_serializer(
            "ProgressResult",
            {
                "id": serializers.IntegerField(),
                "state": serializers.CharField(),
                "iteration": serializers.IntegerField(),
                "last_checkpoint_iteration": serializers.IntegerField(),
                "write_through": serializers.BooleanField(),
            },
        ),
    )
    @action(detail=True, methods=["post"])
    def progress(self, request, pk=None):
        """The job reports its progress: with its job token, or as a user who may submit its tenant's jobs."""
        if isinstance(request.auth, JobToken):
            require(str(request.auth.job_id) == str(pk), "this job token belongs to another job")
            job = request.auth.job
        else:
            job = self.get_object()
            require(self.principal.may_submit_jobs(job.tenant_id), "you may not report progress for this job")
        data = ProgressSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        # The audit entry names the user who reported, or (as its token prefix) the job's own token.
        actor = None if isinstance(request.auth, JobToken) else request.user
        job = job_services.job_progress(job=job, actor=actor, **data.validated_data)
        from jobs.services.moves import write_through_requested

        # ``write_through``: Lockstep is moving the job off a node; its protection runtime writes through and holds.
        return Response(
            {
                "id": job.pk,
                "state": job.state,
                "iteration": job.iteration,
                "last_checkpoint_iteration": job.last_checkpoint_iteration,
                "write_through": write_through_requested(job),
            }
        )

    @extend_schema(
        responses=OpenApiTypes.OBJECT,
        parameters=[
            OpenApiParameter(
                "range",
                OpenApiTypes.STR,
                enum=list(RANGES),
                description="only the last 15 min, 6 h, 7 d or 30 d (the job's whole life without it)",
            )
        ],
    )
    @action(detail=True, methods=["get"])
    def timeline(self, request, pk=None):
        """Phases, faults, actions, snapshots, iterations against the restart-from-checkpoint counterfactual."""
        asked = request.query_params.get("range")
        if asked is not None and asked not in RANGES:
            raise exceptions.ValidationError({"range": [f"one of {', '.join(RANGES)}"]})
        since = timezone.now() - RANGES[asked][1] if asked else None
        return Response(figures.job_timeline(self.get_object(), since=since))

    @extend_schema(methods=["GET"], request=None, responses=SnapshotSerializer(many=True))
    @extend_schema(
        methods=["POST"],
        request=SnapshotReportSerializer,
        responses={201: SnapshotSerializer, 503: ErrorSerializer},
        description="As a provider role (no body): take a platform snapshot through the driver. With the "
        "job's token: report what its protection runtime did (a restore point, a restore, a "
        "disk fallback, a hang).",
    )
    @action(detail=True, methods=["get", "post"], pagination_class=None, filter_backends=[])
    def snapshots(self, request, pk=None):
        if isinstance(request.auth, JobToken):
            require(request.method == "POST", "a job token reports; it reads nothing")
            require(str(request.auth.job_id) == str(pk), "this job token belongs to another job")
            data = SnapshotReportSerializer(data=request.data)
            data.is_valid(raise_exception=True)
            values = dict(data.validated_data)
            values["size_bytes"] = values.pop("bytes", None)
            snapshot = snapshot_report(job=request.auth.job, **values)
            return Response(SnapshotSerializer(snapshot).data, status=status.HTTP_201_CREATED)
        job = self.get_object()
        if request.method == "POST":
            require(self.principal.may_operate, "only provider roles take snapshots")
            snapshot = snapshot_take(actor=request.user, job=job)
            return Response(SnapshotSerializer(snapshot).data, status=status.HTTP_201_CREATED)
        return Response(
            SnapshotSerializer(selectors.snapshot_list(user=request.user, job=job)[:200], many=True).data
        )


class IncidentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Incidents: one underlying failure and every fault report of it, from any source. The detail adds its
    faults, its recovery actions (attempt by attempt) and its line in the GPU-hours ledger; tenant users see
    the incidents they may see the faults of, and of those only their own jobs' actions."""

    serializer_class = IncidentSerializer
    filterset_class = IncidentFilterSet

    def selector(self, *, user):
        if getattr(self, "action", None) == "retrieve":
            return selectors.incident_list(user=user, actions=selectors.action_list(user=user))
        return selectors.incident_list(user=user)

    def get_serializer_class(self):
        return IncidentDetailSerializer if getattr(self, "action", None) == "retrieve" else IncidentSerializer

    # --- the on-call work (jobs.services.incident_work): the incident is looked up first (another tenant's is
    # a 404), then the role is checked (a viewer's 403), then the body (a 400); a state that refuses is a 409.

    def _worked(self):
        """The work on the incident ``_incident`` looked up, as it stands now."""
        rows = selectors.incident_work_list(user=self.request.user).select_related(
            "acknowledged_by", "closed_by"
        )
        return Response(represented(IncidentWorkSerializer, rows.get(pk=self._pk)))

    def _incident(self):
        incident = self.get_object()
        self._pk = incident.pk
        return incident

    @extend_schema(request=None, responses=IncidentWorkSerializer)
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def work(self, request, pk=None):
        """Where the on-call work on it stands: acknowledged, assigned, resolved (with a cause), and the times."""
        self._incident()
        return self._worked()

    @extend_schema(request=None, responses={200: IncidentWorkSerializer, 409: ErrorSerializer})
    @action(detail=True, methods=["post"])
    def acknowledge(self, request, pk=None):
        """A person has it (provider roles): its time to acknowledge stops. 409 if acknowledged or resolved."""
        incident_work.incident_acknowledge(actor=request.user, incident=self._incident())
        return self._worked()

    @extend_schema(
        request=IncidentAssignSerializer, responses={200: IncidentWorkSerializer, 409: ErrorSerializer}
    )
    @action(detail=True, methods=["post"])
    def assign(self, request, pk=None):
        """Give it to a user who may see it, by id (null: to nobody); provider roles."""
        incident = self._incident()
        require(incident_work.may_work(request.user), "only provider roles assign incidents")
        values = validated(IncidentAssignSerializer, request.data)
        assignee = None
        if values["user"] is not None:
            assignee = selectors.incident_assignees(incident=incident).filter(pk=values["user"]).first()
            if assignee is None:
                raise exceptions.ValidationError(
                    {"user": ["no active user who may see this incident has that id"]}
                )
        incident_work.incident_assign(actor=request.user, incident=incident, assignee=assignee)
        return self._worked()

    @extend_schema(methods=["GET"], request=None, responses=IncidentNoteSerializer(many=True))
    @extend_schema(
        methods=["POST"], request=IncidentNoteCreateSerializer, responses={201: IncidentNoteSerializer}
    )
    @action(detail=True, methods=["get", "post"], filter_backends=[], pagination_class=None)
    def notes(self, request, pk=None):
        """Its notes the reader may read (Markdown); POST adds one: provider roles and tenant admins (a tenant's
        note is seen by that tenant and the provider)."""
        incident = self._incident()
        if request.method == "GET":
            rows = selectors.incident_notes(user=request.user, incident=incident)
            return Response(IncidentNoteSerializer(rows, many=True).data)
        require(incident_work.may_annotate(request.user), "you may not add notes to incidents")
        values = validated(IncidentNoteCreateSerializer, request.data)
        note = incident_work.incident_note(actor=request.user, incident=incident, body=values["body"])
        return Response(IncidentNoteSerializer(note).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=IncidentResolveSerializer, responses={200: IncidentWorkSerializer, 409: ErrorSerializer}
    )
    @action(detail=True, methods=["post"])
    def resolve(self, request, pk=None):
        """A person closes it with a cause (provider roles). 409 if it is already resolved or a recovery of it
        still runs."""
        incident = self._incident()
        require(incident_work.may_work(request.user), "only provider roles resolve incidents")
        values = validated(IncidentResolveSerializer, request.data)
        incident_work.incident_resolve(actor=request.user, incident=incident, cause=values["cause"])
        return self._worked()

    @extend_schema(request=None, responses={200: IncidentWorkSerializer, 409: ErrorSerializer})
    @action(detail=True, methods=["post"])
    def reopen(self, request, pk=None):
        """Back to work: its resolution and cause are cleared (provider roles). 409 if it is not resolved."""
        incident_work.incident_reopen(actor=request.user, incident=self._incident())
        return self._worked()


@extend_schema(
    parameters=[
        OpenApiParameter(
            "Idempotency-Key",
            OpenApiTypes.STR,
            OpenApiParameter.HEADER,
            description="makes retries of a POST safe",
        )
    ]
)
class FaultViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Fault events. POST reports one (provider roles); reports of the same fault merge into one event."""

    serializer_class = FaultSerializer
    filterset_class = FaultEventFilterSet

    def selector(self, *, user):
        return selectors.fault_list(user=user)

    @extend_schema(
        request=FaultReportSerializer,
        responses={
            201: OpenApiResponse(FaultSerializer, description="a new fault event"),
            200: OpenApiResponse(
                FaultSerializer, description="a report of a fault already recorded (merged into it)"
            ),
        },
    )
    def create(self, request):
        require(self.principal.may_operate, "only provider roles report faults")
        values = validated(FaultReportSerializer, request.data)
        node = self._reported_node(
            node=values.pop("node", None),
            hostname=values.pop("hostname", None),
            cluster=values.pop("cluster", None),
        )
        key = (request.headers.get("Idempotency-Key") or "").strip() or None
        if key and len(key) > 200:
            raise exceptions.ValidationError({"Idempotency-Key": ["at most 200 characters"]})
        fault, created = fault_services.fault_ingest(
            node=node, idempotency_key=key, actor=request.user, **values
        )
        body = represented(FaultSerializer, fault)
        return Response(
            {**body, "created": created}, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )

    def _reported_node(
        self, *, node: int | str | None, hostname: str | None, cluster: int | str | None
    ) -> Node:
        """The node a report names: by id, or by hostname (with its cluster where several clusters have it)."""
        field = "hostname" if node is None else "node"
        if node is not None and not isinstance(node, int):
            node, hostname = None, node
        found = fleet_selectors.nodes_named(
            user=self.request.user,
            node=node,
            hostname=hostname,
            cluster=cluster if isinstance(cluster, int) else None,
            cluster_name=cluster if isinstance(cluster, str) else None,
        )
        if not found:
            where = f" on cluster {cluster}" if cluster is not None else ""
            raise exceptions.ValidationError(
                {field: [f"no node named {hostname}{where}" if hostname else "no such node"]}
            )
        if len(found) > 1:
            clusters = sorted(
                fleet_selectors.node_list(user=self.request.user)
                .filter(hostname=hostname)
                .values_list("cluster__name", flat=True)
            )
            raise exceptions.ValidationError(
                {
                    field: [
                        f"hostname {hostname} is on several clusters ({', '.join(clusters)}): name its cluster "
                        f'("cluster": id or name) or give the node\'s id'
                    ]
                }
            )
        return found[0]

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"])
    def repaired(self, request, pk=None):
        """An operator repaired the node this fault took out (rebooted it, replaced a part): its escalation
        ladder goes on to the health check and, if that passes, back to the spare pool (provider roles)."""
        fault = self.get_object()
        require(self.principal.may_operate, "only provider roles mark nodes repaired")
        reason = str(request.data.get("reason", ""))[:300] if hasattr(request.data, "get") else ""
        ladder = escalation_repaired(actor=request.user, node=fault.node, reason=reason)
        return Response({"node": fault.node_id, "stage": ladder.stage})


class RecoveryActionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Recovery actions, with the alternatives the planner weighed and the GPU-hours ledger."""

    serializer_class = RecoveryActionSerializer
    filterset_class = RecoveryActionFilterSet

    def selector(self, *, user):
        return selectors.action_list(user=user)


@extend_schema(
    parameters=[
        OpenApiParameter(
            "group",
            OpenApiTypes.STR,
            enum=list(figures.GROUPS),
            description="totals per job, cluster, tenant or fleet",
        ),
        OpenApiParameter(
            "bucket", OpenApiTypes.STR, enum=list(figures.BUCKETS), description="time buckets of the series"
        ),
        OpenApiParameter("hours", OpenApiTypes.INT, description="only the last N hours"),
    ],
    responses=OpenApiTypes.OBJECT,
)
class StatsViewSet(ScopedViewSet):
    """GPU-hours saved, lost and at baseline, faults and actions: totals per group and over time. Tenant users
    get their own jobs' figures (per job or tenant); fleet and cluster figures are for provider roles."""

    def selector(self, *, user):
        return selectors.action_list(user=user)

    def list(self, request):
        group = request.query_params.get("group", "fleet" if self.principal.is_provider else "tenant")
        bucket = request.query_params.get("bucket", "hour")
        if group not in figures.GROUPS:
            raise exceptions.ValidationError({"group": [f"one of {', '.join(figures.GROUPS)}"]})
        if bucket not in figures.BUCKETS:
            raise exceptions.ValidationError({"bucket": [f"one of {', '.join(figures.BUCKETS)}"]})
        require(
            group not in ("fleet", "cluster") or self.principal.is_provider,
            "fleet and cluster figures are for provider roles",
        )
        since = None
        if request.query_params.get("hours"):
            try:
                hours = int(request.query_params["hours"])
                if not 0 < hours <= 24 * 366:
                    raise ValueError
            except ValueError as error:
                raise exceptions.ValidationError({"hours": ["a whole number of hours, 1 to 8784"]}) from error
            since = timezone.now() - timedelta(hours=hours)
        return Response(
            figures.gpu_hours_stats(
                actions=self.get_queryset(),
                faults=selectors.job_fault_list(user=request.user),
                group=group,
                bucket=bucket,
                since=since,
            )
        )
