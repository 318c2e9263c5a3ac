from django.contrib.auth import get_user_model
from rest_framework import serializers

from tenancy.choices import Role, TenantTier, TokenScope
from tenancy.models import ApiToken, Tenant

User = get_user_model()


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "name", "slug", "tier", "created_at"]
        read_only_fields = ["id", "created_at"]
        # Uniqueness is checked by the service inside its transaction.
        extra_kwargs = {"name": {"validators": []}, "slug": {"validators": []}}


class TenantWriteSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    slug = serializers.SlugField(max_length=50)
    tier = serializers.ChoiceField(choices=TenantTier.choices, default=TenantTier.STANDARD)


class ApiTokenSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)
    active = serializers.BooleanField(source="is_active", read_only=True)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "user",
            "scope",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
            "active",
        ]
        read_only_fields = fields


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    scope = serializers.ChoiceField(choices=TokenScope.choices, default=TokenScope.READ)
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    user = serializers.CharField(
        required=False, help_text="username of the owner (admins only); yourself by default"
    )


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="shown once; only its digest is stored")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class UserSerializer(serializers.ModelSerializer):
    role = serializers.CharField(source="membership.role", read_only=True, default=None, allow_null=True)
    tenant = serializers.IntegerField(
        source="membership.tenant_id", read_only=True, default=None, allow_null=True
    )
    # Often empty, which an "email" format would refuse.
    email = serializers.CharField(read_only=True, help_text="an email address, or empty")

    class Meta:
        model = User
        fields = ["id", "username", "email", "is_active", "role", "tenant"]
        read_only_fields = fields


class UserCreateSerializer(serializers.Serializer):
    username = serializers.RegexField(r"^[\w.@+-]{1,150}$", max_length=150)
    email = serializers.EmailField(required=False, allow_blank=True, default="")
    role = serializers.ChoiceField(choices=Role.choices)
    tenant = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    password = serializers.CharField(required=False, write_only=True, min_length=10, max_length=128)


class UserRoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)
    tenant = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        help_text="the tenant, for tenant roles (none for provider roles); omitted, the one the user is in",
    )


class UserPasswordSerializer(serializers.Serializer):
    password = serializers.CharField(read_only=True, help_text="the new password, shown once")


class UserCreatedSerializer(UserSerializer):
    password = serializers.CharField(
        read_only=True, allow_null=True, help_text="generated password, shown once"
    )

    class Meta(UserSerializer.Meta):
        fields = [*UserSerializer.Meta.fields, "password"]
        read_only_fields = fields


# A token bound to one cluster (an agent's, a launcher's) as it is listed: its prefix, never the token. Each kind
# subclasses it, so each keeps its own name in the API's schema (a comment, not a docstring: the schema would
# carry a docstring as every subclass's description).
class ClusterTokenSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    cluster = serializers.IntegerField(source="cluster_id")
    name = serializers.CharField(max_length=100)
    prefix = serializers.CharField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)
    last_used_at = serializers.DateTimeField(read_only=True, allow_null=True)
    revoked_at = serializers.DateTimeField(read_only=True, allow_null=True)
