"""REST for launchers: ``POST /api/v1/launchers/register/`` (a launcher credential, ``lsl_…``),
``/api/v1/launcher-credentials/`` (provider roles: list, create — the token is answered once — and revoke) and
``/api/v1/slurm-jobs/`` (the Slurm jobs Lockstep follows; ``?unmapped=true``: those of accounts that map to no
tenant, providers only)."""

from django.urls import path
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import mixins, permissions, serializers, status
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView

from controlplane.api import ScopedViewSet
from controlplane.errors import ServiceError
from controlplane.security_ratelimit import TokenCreateThrottle
from fleet.selectors import cluster_list
from jobs.filtersets import SlurmJobFilterSet
from jobs.launchers import (
    LauncherAuthentication,
    LauncherPrincipal,
    launcher_credential_create,
    launcher_credential_revoke,
    launcher_register,
)
from jobs.models import LauncherCredential, SlurmJob
from jobs.selectors import slurm_job_list
from tenancy.api.serializers import ClusterTokenSerializer
from tenancy.permissions import IsProvider


class LauncherCredentialScheme(OpenApiAuthenticationExtension):
    target_class = "jobs.launchers.LauncherAuthentication"
    name = "launcherCredential"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A cluster's launcher credential: lsl_xxxxxxxx_…",
        }


class IsLauncher(permissions.BasePermission):
    message = "This endpoint takes a launcher credential (lsl_…), bound to one cluster."

    def has_permission(self, request, view):
        return isinstance(request.user, LauncherPrincipal)


class RegisterSerializer(serializers.Serializer):
    slurm_job_id = serializers.CharField(max_length=20)
    cluster = serializers.CharField(
        max_length=100,
        required=False,
        help_text="the cluster the job runs on (id or name); must be the credential's",
    )


class LauncherRegisterView(APIView):
    """A job script registers the Slurm job it runs in (``SLURM_JOB_ID``) and gets its job token (shown once).
    409 while a recovery of the job is under way: register again in a moment."""

    authentication_classes = [LauncherAuthentication]
    permission_classes = [IsLauncher]

    @extend_schema(
        request=RegisterSerializer,
        responses={
            201: inline_serializer(
                "LauncherRegistered",
                {
                    "job": serializers.IntegerField(),
                    "job_token": serializers.CharField(),
                    "slurm_job_id": serializers.CharField(),
                    "restart_count": serializers.IntegerField(),
                },
            )
        },
    )
    def post(self, request):
        data = RegisterSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job, raw, link = launcher_register(
            credential=request.auth,
            slurm_job_id=data.validated_data["slurm_job_id"],
            cluster_named=data.validated_data.get("cluster"),
        )
        return Response(
            {
                "job": job.pk,
                "job_token": raw,
                "slurm_job_id": link.slurm_job_id,
                "restart_count": link.restart_count,
            },
            status=status.HTTP_201_CREATED,
        )


class LauncherCredentialSerializer(ClusterTokenSerializer):
    pass


class LauncherCredentialCreatedSerializer(LauncherCredentialSerializer):
    token = serializers.CharField(read_only=True, help_text="shown once; only its digest is stored")


class LauncherCredentialViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Launcher credentials, each bound to one cluster (provider roles). DELETE revokes."""

    serializer_class = LauncherCredentialSerializer
    permission_classes = [*ScopedViewSet.permission_classes, IsProvider]
    throttle_classes = [TokenCreateThrottle]
    filterset_fields = ["cluster"]
    http_method_names = ["get", "post", "delete", "head", "options"]
    queryset = LauncherCredential.objects.none()

    def selector(self, *, user):
        return LauncherCredential.objects.select_related("cluster").order_by("-created_at", "-id")

    @extend_schema(request=LauncherCredentialSerializer, responses={201: LauncherCredentialCreatedSerializer})
    def create(self, request):
        data = LauncherCredentialSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        cluster = cluster_list(user=request.user).filter(pk=data.validated_data["cluster_id"]).first()
        if cluster is None:
            raise ServiceError("no such cluster", field="cluster")
        credential, raw = launcher_credential_create(
            actor=request.user, cluster=cluster, name=data.validated_data["name"]
        )
        body = LauncherCredentialSerializer(credential).data
        body["token"] = raw
        return Response(body, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        launcher_credential_revoke(actor=request.user, credential=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class SlurmJobSerializer(serializers.ModelSerializer):
    job = serializers.IntegerField(
        source="job_id", allow_null=True, help_text="its Lockstep job; null: unmapped"
    )

    class Meta:
        model = SlurmJob
        fields = [
            "id",
            "cluster",
            "slurm_job_id",
            "job",
            "account",
            "slurm_state",
            "nodes",
            "restart_count",
            "registered_at",
            "seen_at",
            "unmapped",
        ]
        read_only_fields = fields


class SlurmJobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """The Slurm jobs Lockstep follows, as Slurm last reported them. A job whose account maps to no tenant has no
    Lockstep job (``job`` null, ``unmapped`` says why) and is listed to providers only."""

    serializer_class = SlurmJobSerializer
    filterset_class = SlurmJobFilterSet
    queryset = SlurmJob.objects.none()

    def selector(self, *, user):
        return slurm_job_list(user=user)


router = SimpleRouter()
router.register("slurm-jobs", SlurmJobViewSet, basename="slurm-job")
router.register("launcher-credentials", LauncherCredentialViewSet, basename="launcher-credential")

urlpatterns = [
    path("launchers/register/", LauncherRegisterView.as_view(), name="launcher-register"),
    *router.urls,
]
