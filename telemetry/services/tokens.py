"""Agent tokens (``lsa_<prefix>_<secret>``), bound to one cluster: issued, revoked and rotated, as every token is
made (fleet.services.cluster_tokens); checked in telemetry.authentication."""

from django.db import transaction

from controlplane.errors import ServiceError
from fleet.services.cluster_tokens import cluster_token_issue, cluster_token_revoke
from telemetry.models import AgentToken


def agent_token_create(*, actor, cluster, name: str) -> tuple[AgentToken, str]:
    """A new agent token for one cluster; returns the row and the token, which is shown only now."""
    return cluster_token_issue(
        model=AgentToken, action="agent_token.create", actor=actor, cluster=cluster, name=name
    )


def agent_token_revoke(*, actor, token: AgentToken) -> AgentToken:
    return cluster_token_revoke(action="agent_token.revoke", actor=actor, token=token, audit_tenant=False)


@transaction.atomic
def agent_token_rotate(*, actor, token: AgentToken) -> tuple[AgentToken, str]:
    """Revoke a token and issue its successor for the same cluster and name."""
    if token.revoked_at is not None:
        raise ServiceError("a revoked token cannot be rotated", status=409)
    agent_token_revoke(actor=actor, token=token)
    return agent_token_create(actor=actor, cluster=token.cluster, name=token.name)
