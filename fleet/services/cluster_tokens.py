"""Tokens bound to one cluster (an agent's ``lsa_…``, a launcher's ``lsl_…``): issued and revoked with an audit
entry, as every token is made (tenancy.tokens, tenancy.services). Each kind's services name their model and
audit action."""

from django.db import transaction

from controlplane.audit import audit_record
from tenancy.models import Token
from tenancy.services import token_issue, token_mark_revoked


@transaction.atomic
def cluster_token_issue(
    *, model: type[Token], action: str, actor, cluster, name: str, tenant=None
) -> tuple[Token, str]:
    """A new token of ``model`` for one cluster (and, for a kind that has one, a ``tenant``: a launcher
    credential's); returns the row and the token, which is shown only now."""
    extra = {"tenant": tenant} if tenant is not None else {}
    token, raw = token_issue(
        model=model,
        cluster=cluster,
        name=name[:100],
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
        **extra,
    )
    audit_record(
        actor=actor,
        action=action,
        target=token,
        tenant_id=tenant.pk if tenant is not None else cluster.dedicated_tenant_id,
        changes={"cluster": cluster.name, "name": name, **({"tenant": tenant.slug} if tenant else {})},
    )
    return token, raw


@transaction.atomic
def cluster_token_revoke(*, action: str, actor, token: Token, audit_tenant: bool = True) -> Token:
    """Revoke the token (once: revoking a revoked one changes and records nothing). ``audit_tenant``: whether
    the audit entry names the cluster's dedicated tenant."""
    token = type(token).objects.select_for_update().select_related("cluster").get(pk=token.pk)
    if token_mark_revoked(token=token):
        tenant = {"tenant_id": token.cluster.dedicated_tenant_id} if audit_tenant else {}
        audit_record(actor=actor, action=action, target=token, changes={"revoked": True}, **tenant)
    return token
