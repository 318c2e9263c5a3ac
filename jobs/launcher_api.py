"""REST for launchers: ``POST /api/v1/launchers/register/`` (a launcher credential, ``lsl_…``),
``/api/v1/launcher-credentials/`` (provider roles: list, create — the token is answered once — and revoke) and
``/api/v1/slurm-jobs/`` (the Slurm jobs Lockstep follows; ``?unmapped=true``: those of accounts that map to no
tenant, providers only)."""

from django.urls import path
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import extend_schema, extend_schema_view, inline_serializer
from rest_framework import mixins, permissions, serializers, status
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView

from controlplane.api import ScopedViewSet
from fleet.api.views_tokens import ClusterTokenViewSet
from jobs.filtersets import SlurmJobFilterSet
from jobs.launchers import (
    LauncherAuthentication,
    LauncherPrincipal,
    launcher_credential_create,
    launcher_credential_revoke,
    launcher_register,
)
from jobs.models import LauncherCredential, SlurmJob
from jobs.selectors import launcher_credential_list, slurm_job_list
from tenancy.api.serializers import ClusterTokenSerializer


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


@extend_schema_view(
    create=extend_schema(
        request=LauncherCredentialSerializer, responses={201: LauncherCredentialCreatedSerializer}
    ),
)
class LauncherCredentialViewSet(ClusterTokenViewSet):
    """Launcher credentials, each bound to one cluster (provider roles). DELETE revokes."""

    serializer_class = LauncherCredentialSerializer
    queryset = LauncherCredential.objects.none()

    def selector(self, *, user):
        return launcher_credential_list(user=user)

    def issue(self, *, actor, cluster, name):
        return launcher_credential_create(actor=actor, cluster=cluster, name=name)

    def revoke(self, *, actor, token):
        launcher_credential_revoke(actor=actor, credential=token)


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
