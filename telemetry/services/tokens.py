"""Agent tokens (``lsa_<prefix>_<secret>``), bound to one cluster: issued, revoked and rotated, as every token is
made (tenancy.tokens, tenancy.services); checked in telemetry.authentication."""

from django.db import transaction

from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from telemetry.models import AgentToken
from tenancy.services import token_issue, token_mark_revoked


@transaction.atomic
def agent_token_create(*, actor, cluster, name: str) -> tuple[AgentToken, str]:
    """A new agent token for one cluster; returns the row and the token, which is shown only now."""
    token, raw = token_issue(
        model=AgentToken,
        cluster=cluster,
        name=name,
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
    )
    audit_record(
        actor=actor,
        action="agent_token.create",
        target=token,
        tenant_id=cluster.dedicated_tenant_id,
        changes={"cluster": cluster.name, "name": name},
    )
    return token, raw


@transaction.atomic
def agent_token_revoke(*, actor, token: AgentToken) -> AgentToken:
    token = AgentToken.objects.select_for_update().get(pk=token.pk)
    if token_mark_revoked(token=token):
        audit_record(actor=actor, action="agent_token.revoke", target=token, changes={"revoked": True})
    return token


@transaction.atomic
def agent_token_rotate(*, actor, token: AgentToken) -> tuple[AgentToken, str]:
    """Revoke a token and issue its successor for the same cluster and name."""
    if token.revoked_at is not None:
        raise ServiceError("a revoked token cannot be rotated", status=409)
    agent_token_revoke(actor=actor, token=token)
    return agent_token_create(actor=actor, cluster=token.cluster, name=token.name)
