"""Agent tokens (``lsa_<prefix>_<secret>``): bound to one cluster, hashed at rest like API tokens."""

import re
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework import authentication, exceptions

from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from telemetry.models import AgentToken
from tenancy.tokens import digest

AGENT_TOKEN_PATTERN = re.compile(r"^lsa_[a-z0-9]{8}_[A-Za-z0-9_-]{32,64}$")


def _generate() -> tuple[str, str, str]:
    prefix = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8))
    raw = f"lsa_{prefix}_{secrets.token_urlsafe(32)}"
    return raw, prefix, digest(raw)


@transaction.atomic
def agent_token_create(*, actor, cluster, name: str) -> tuple[AgentToken, str]:
    """A new agent token for one cluster; returns the row and the token, which is shown only now."""
    raw, prefix, hashed = _generate()
    token = AgentToken.objects.create(cluster=cluster, name=name, prefix=prefix, digest=hashed,
                                      created_by=actor if getattr(actor, "is_authenticated", False) else None)
    audit_record(actor=actor, action="agent_token.create", target=token, tenant_id=cluster.dedicated_tenant_id,
                 changes={"cluster": cluster.name, "name": name})
    return token, raw


@transaction.atomic
def agent_token_revoke(*, actor, token: AgentToken) -> AgentToken:
    token = AgentToken.objects.select_for_update().get(pk=token.pk)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit_record(actor=actor, action="agent_token.revoke", target=token, changes={"revoked": True})
    return token


@transaction.atomic
def agent_token_rotate(*, actor, token: AgentToken) -> tuple[AgentToken, str]:
    """Revoke a token and issue its successor for the same cluster and name."""
    if token.revoked_at is not None:
        raise ServiceError("a revoked token cannot be rotated", status=409)
    agent_token_revoke(actor=actor, token=token)
    return agent_token_create(actor=actor, cluster=token.cluster, name=token.name)


class AgentPrincipal:
    """request.user for an agent: authenticated, no role; request.auth is the AgentToken."""

    is_authenticated = True
    is_active = True
    is_anonymous = False
    is_superuser = False
    pk = None

    def __init__(self, token: AgentToken):
        self.token = token
        self.cluster_id = token.cluster_id

    def get_username(self) -> str:
        return f"agent:{self.token.prefix}"


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer lsa_…``: answers 401 naming what is wrong."""

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != b"bearer":
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: expected 'Bearer <token>'.")
        raw = header[1].decode("latin-1")
        if not AGENT_TOKEN_PATTERN.match(raw):
            raise exceptions.AuthenticationFailed("Malformed agent token: agent tokens look like lsa_xxxxxxxx_….")
        token = AgentToken.objects.select_related("cluster").filter(digest=digest(raw)).first()
        if token is None:
            raise exceptions.AuthenticationFailed("Unknown agent token.")
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("Agent token has been revoked.")
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at >= timedelta(seconds=settings.TOKEN_LAST_USED_RESOLUTION):
            AgentToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return AgentPrincipal(token), token

    def authenticate_header(self, request):
        return 'Bearer realm="ingest"'
