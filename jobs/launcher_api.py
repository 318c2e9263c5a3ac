"""REST for launchers: ``POST /api/v1/launchers/register/`` (a launcher credential, ``lsl_…``, and the job's
secret where its cluster asks for one), ``/api/v1/launcher-credentials/`` (provider roles: list, create for a
cluster and a tenant — the token is answered once — and revoke) and
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
from controlplane.errors import ServiceError
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
from tenancy.selectors import tenant_list


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
    job_secret = serializers.CharField(
        max_length=128,
        required=False,
        allow_blank=True,
        help_text="the job's secret (LOCKSTEP_JOB_SECRET, set by the cluster's Slurm prolog); required where the "
        "cluster asks jobs to prove themselves",
    )
    cluster = serializers.CharField(
        max_length=100,
        required=False,
        help_text="the cluster the job runs on (id or name); must be the credential's",
    )


class LauncherRegisterView(APIView):
    """A job script registers the Slurm job it runs in (``SLURM_JOB_ID``) and gets its job token (shown once);
    the job's earlier tokens stop working. 403 for a job that is not the credential's tenant's, or without the
    job's own secret where the cluster asks for it. 409 while a recovery of the job is under way: register again
    in a moment."""

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
            job_secret=data.validated_data.get("job_secret", ""),
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
    tenant = serializers.IntegerField(
        source="tenant_id",
        required=False,
        allow_null=True,
        min_value=1,
        max_value=2**63 - 1,
        help_text="the tenant whose jobs it registers (a dedicated cluster's own by default); null on a shared "
        "cluster: cluster-wide, which registers only where the cluster asks jobs for their secret",
    )


class LauncherCredentialCreatedSerializer(LauncherCredentialSerializer):
    token = serializers.CharField(read_only=True, help_text="shown once; only its digest is stored")


@extend_schema_view(
    create=extend_schema(
        request=LauncherCredentialSerializer, responses={201: LauncherCredentialCreatedSerializer}
    ),
)
class LauncherCredentialViewSet(ClusterTokenViewSet):
    """Launcher credentials, each bound to one cluster and the jobs of one tenant (provider roles). DELETE
    revokes."""

    serializer_class = LauncherCredentialSerializer
    queryset = LauncherCredential.objects.none()

    def selector(self, *, user):
        return launcher_credential_list(user=user)

    def issue(self, *, actor, cluster, name):
        data = LauncherCredentialSerializer(data=self.request.data)
        data.is_valid(raise_exception=True)
        tenant_id = data.validated_data.get("tenant_id")
        tenant = None
        if tenant_id is not None:
            tenant = tenant_list(user=actor).filter(pk=tenant_id).first()
            if tenant is None:
                raise ServiceError("no such tenant", field="tenant")
        return launcher_credential_create(actor=actor, cluster=cluster, name=name, tenant=tenant)

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
