"""Writes of the tenancy app: tenants, users and their roles, API tokens. Each audited, each in a transaction.

Every kind of token (API, agent, job, launcher) is issued by ``token_issue``, has its use noted by ``token_touch``
and is revoked by ``token_mark_revoked``; the services that call those two audit what they issue and revoke."""

import hashlib
import re
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from controlplane import events
from controlplane.access import PROVIDER_ROLES, principal, require
from controlplane.audit import audit_record, audit_record_sampled, field_changes
from controlplane.context import current as request_context
from controlplane.errors import ServiceError
from controlplane.wsauth import credentials_revoked
from tenancy.choices import Role, TenantTier, TokenScope
from tenancy.models import ApiToken, ExternalIdentity, Membership, Tenant, Token
from tenancy.tokens import generate

User = get_user_model()


@transaction.atomic
def tenant_create(*, actor, name: str, slug: str, tier: str = TenantTier.STANDARD) -> Tenant:
    require(principal(actor).is_provider_admin, "Only the provider admin may create tenants.")
    if Tenant.objects.filter(name=name).exists():
        raise ServiceError("a tenant with this name exists", field="name")
    if Tenant.objects.filter(slug=slug).exists():
        raise ServiceError("a tenant with this slug exists", field="slug")
    tenant = Tenant.objects.create(name=name, slug=slug, tier=tier)
    audit_record(
        actor=actor,
        action="tenant.create",
        target=tenant,
        tenant_id=tenant.pk,
        changes={"name": name, "slug": slug, "tier": tier},
    )
    events.publish(
        [events.topic("fleet"), events.topic("tenant", tenant.pk)],
        "tenant.created",
        {"id": tenant.pk, "name": name, "tier": tier},
        url=f"/api/v1/tenants/{tenant.pk}/",
    )
    return tenant


@transaction.atomic
def tenant_update(*, actor, tenant: Tenant, **fields) -> Tenant:
    require(principal(actor).is_provider_admin, "Only the provider admin may change tenants.")
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    for unique in ("name", "slug"):
        if (
            unique in fields
            and Tenant.objects.filter(**{unique: fields[unique]}).exclude(pk=tenant.pk).exists()
        ):
            raise ServiceError(f"a tenant with this {unique} exists", field=unique)
    changes = field_changes(tenant, fields)
    for name, value in fields.items():
        setattr(tenant, name, value)
    tenant.save()
    if changes:
        audit_record(actor=actor, action="tenant.update", target=tenant, tenant_id=tenant.pk, changes=changes)
        events.publish(
            [events.topic("fleet"), events.topic("tenant", tenant.pk)],
            "tenant.updated",
            {"id": tenant.pk, "changes": changes},
            url=f"/api/v1/tenants/{tenant.pk}/",
        )
    return tenant


@transaction.atomic
def user_create(
    *,
    actor,
    username: str,
    role: str,
    tenant: Tenant | None = None,
    email: str = "",
    password: str | None = None,
) -> tuple[User, str | None]:
    """A user with a role. Returns the user and, when no password was given, a generated one to show once."""
    _may_grant(actor, role, tenant)
    if User.objects.filter(username=username).exists():
        raise ServiceError("a user with this name exists", field="username")
    generated = None
    if password is None:
        generated = password = secrets.token_urlsafe(12)
    return _user_make(
        actor=actor, username=username, email=email, password=password, role=role, tenant=tenant
    ), generated


def _user_make(
    *, actor, username: str, email: str, password: str | None, role: str, tenant, sso: bool = False
):
    """A new user with its membership, audited as user.create (a password of None: it has none usable)."""
    user = User.objects.create_user(username=username, email=email, password=password)
    Membership.objects.create(user=user, tenant=tenant, role=role)
    changes = {"username": username, "role": role, "tenant": tenant.pk if tenant else None}
    audit_record(
        actor=actor,
        action="user.create",
        target=user,
        tenant_id=tenant.pk if tenant else None,
        changes={**changes, "sso": True} if sso else changes,
    )
    return user


@transaction.atomic
def user_deactivate(*, actor, user) -> None:
    membership = Membership.objects.filter(user=user).first()
    tenant_id = membership.tenant_id if membership else None
    require(principal(actor).may_manage_user_of(tenant_id), "You may not deactivate this user.")
    if user.pk == getattr(actor, "pk", None):
        raise ServiceError("you cannot deactivate yourself", status=409)
    User.objects.filter(pk=user.pk).update(is_active=False)
    _revoke_tokens(user)
    audit_record(
        actor=actor,
        action="user.deactivate",
        target=user,
        tenant_id=tenant_id,
        changes={"is_active": [True, False]},
    )
    credentials_revoked(user_id=user.pk)  # its open websockets close


def _may_grant(actor, role: str, tenant: Tenant | None) -> None:
    """Refuse (403) a role ``actor`` may not give: provider roles only the provider admin, a tenant's roles that
    tenant's admin too. A provider role with a tenant, or a tenant role without one, is bad input (400)."""
    who = principal(actor)
    if role in PROVIDER_ROLES:
        require(who.is_provider_admin, "Only the provider admin may give provider roles.")
        if tenant is not None:
            raise ServiceError("provider roles belong to no tenant", field="tenant")
    else:
        if tenant is None:
            raise ServiceError("tenant roles need a tenant", field="tenant")
        require(who.may_manage_users(tenant.pk), "You may not give roles in this tenant.")


def _revoke_tokens(user) -> int:
    return ApiToken.objects.filter(user=user, revoked_at__isnull=True).update(revoked_at=timezone.now())


def _membership_set(*, actor, user, role: str, tenant: Tenant | None) -> dict:
    """Give ``user`` ``role`` in ``tenant``, audited as user.role; the changes made (none: nothing to do). A user
    moved to another tenant loses its API tokens (they would act in the new tenant); its open pages re-check."""
    membership = Membership.objects.select_for_update().filter(user=user).first()
    before = (membership.role, membership.tenant_id) if membership else (None, None)
    after = (role, tenant.pk if tenant else None)
    if before == after:
        return {}
    if membership is None:
        Membership.objects.create(user=user, role=role, tenant=tenant)
    else:
        Membership.objects.filter(pk=membership.pk).update(role=role, tenant=tenant)
    changes = {"role": [before[0], after[0]], "tenant": [before[1], after[1]]}
    if before[1] != after[1] and _revoke_tokens(user):
        changes["tokens_revoked"] = True
    audit_record(
        actor=actor, action="user.role", target=user, tenant_id=after[1] or before[1], changes=changes
    )
    credentials_revoked(user_id=user.pk)  # its open sockets check their credential and role again
    user.__dict__.pop("_lockstep_principal", None)
    return changes


@transaction.atomic
def user_set_role(*, actor, user, role: str, tenant: Tenant | None = None) -> dict:
    """Change a user's role (and, for the provider admin, its tenant). Not one's own: an admin would lock
    themselves out. Returns the changes made."""
    current = Membership.objects.filter(user=user).values_list("tenant_id", flat=True).first()
    require(principal(actor).may_manage_user_of(current), "You may not change this user's role.")
    _may_grant(actor, role, tenant)
    if user.pk == getattr(actor, "pk", None):
        raise ServiceError("you cannot change your own role", field="role", status=409)
    return _membership_set(actor=actor, user=user, role=role, tenant=tenant)


@transaction.atomic
def user_reset_password(*, actor, user) -> str:
    """Give ``user`` a new random password, returned to be shown once (only its hash is kept). Its sessions end
    (Django ties a session to the password) and its open pages close; its API tokens stay."""
    tenant_id = Membership.objects.filter(user=user).values_list("tenant_id", flat=True).first()
    require(principal(actor).may_manage_user_of(tenant_id), "You may not reset this user's password.")
    if user.pk == getattr(actor, "pk", None):
        raise ServiceError("change your own password yourself, not by a reset", status=409)
    if hasattr(user, "external_identity"):
        raise ServiceError("this user logs in through single sign-on and has no password here", status=409)
    password = secrets.token_urlsafe(12)
    user.set_password(password)
    user.save(update_fields=["password"])
    audit_record(
        actor=actor,
        action="user.password-reset",
        target=user,
        tenant_id=tenant_id,
        changes={"password": "reset"},
    )
    credentials_revoked(user_id=user.pk)
    return password


def _free_username(wanted: str, subject: str) -> str:
    """``wanted`` as a user name, or, when a user has it, with a few characters of the subject's digest."""
    base = re.sub(r"[^\w.@+-]", "-", wanted)[:120] or "sso-user"
    if not User.objects.filter(username=base).exists():
        return base
    return f"{base}-{hashlib.sha256(subject.encode()).hexdigest()[:8]}"


@transaction.atomic
def sso_login(*, issuer: str, subject: str, username: str, email: str, role: str, tenant: Tenant | None):
    """The user the provider vouched for (by issuer and subject), made at its first login, with the role and
    tenant its groups give now. A disabled user stays disabled (ServiceError, 403)."""
    identity = ExternalIdentity.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
    if identity is None:
        username = _free_username(username, subject)
        user = _user_make(
            actor=None, username=username, email=email, password=None, role=role, tenant=tenant, sso=True
        )
        ExternalIdentity.objects.create(user=user, issuer=issuer, subject=subject)
        return user
    user = identity.user
    if not user.is_active:
        raise ServiceError("Your Lockstep account is disabled: ask your administrator.", status=403)
    if email and user.email != email:
        User.objects.filter(pk=user.pk).update(email=email)
    _membership_set(actor=None, user=user, role=role, tenant=tenant)
    return user


@transaction.atomic
def sso_refused(*, subject: str, groups: list[str], reason: str) -> None:
    """Audit a single sign-on the provider vouched for and Lockstep refused (no role, or a disabled user)."""
    identity = ExternalIdentity.objects.select_related("user__membership").filter(subject=subject).first()
    membership = getattr(identity.user, "membership", None) if identity else None
    audit_record(
        actor=None,
        action="login.sso-refused",
        object_type="auth.user",
        object_id=str(identity.user_id) if identity else "",
        tenant_id=membership.tenant_id if membership else None,
        changes={"subject": subject[:255], "groups": groups[:50], "reason": reason},
    )


# Of the login attempts the rate limit refuses, the first per name and address in this window is audited.
THROTTLED_LOGIN_AUDIT_SECONDS = 60


@transaction.atomic
def login_refused(*, username: str, throttled: bool = False) -> None:
    """Audit a refused login: the name tried and, from the request, the address. Every attempt whose password was
    checked and refused is kept (the login rate limits bound how many one address makes); of those refused for
    the rate limit before any check, the first per name and address in THROTTLED_LOGIN_AUDIT_SECONDS. A name that
    is a user's names that user (and its tenant, whose admins see the entry)."""
    username = username.replace("\x00", "")[:150]  # NUL fits neither a query nor a JSON column
    user = User.objects.filter(username=username).first() if username else None
    tenant_id = (
        Membership.objects.filter(user=user).values_list("tenant_id", flat=True).first() if user else None
    )
    fields = {
        "actor": None,
        "action": "login.throttled" if throttled else "login.failed",
        "object_type": "auth.user",
        "object_id": str(user.pk) if user else "",
        "tenant_id": tenant_id,
        "changes": {"username": username},
    }
    if throttled:
        key = f"login-throttled:{request_context().remote_addr}:{username.casefold()}"
        audit_record_sampled(key=key, seconds=THROTTLED_LOGIN_AUDIT_SECONDS, **fields)
    else:
        audit_record(**fields)


def may_manage_tokens_of(actor, owner) -> bool:
    if getattr(actor, "pk", None) == owner.pk:
        return True
    owner_tenant = Membership.objects.filter(user=owner).values_list("tenant_id", flat=True).first()
    return principal(actor).may_manage_user_of(owner_tenant)


@transaction.atomic
def token_issue(*, model: type[Token], **fields) -> tuple[Token, str]:
    """A new token of any kind (``model``: ApiToken, AgentToken, JobToken, LauncherCredential) with ``fields``.
    Returns the row and the token itself, which is shown only now: only its digest is kept."""
    raw, prefix, digest = generate(model.kind)
    return model.objects.create(prefix=prefix, digest=digest, **fields), raw


def token_touch(*, token: Token) -> None:
    """Note that ``token`` was used now, at most once every TOKEN_LAST_USED_RESOLUTION seconds (every request
    authenticates, and a write each time would cost more than the answer)."""
    now = timezone.now()
    if token.last_used_at is not None and now - token.last_used_at < timedelta(
        seconds=settings.TOKEN_LAST_USED_RESOLUTION
    ):
        return
    # One UPDATE, atomic by itself: a transaction around it would add only round trips to a request's path.
    type(token).objects.filter(pk=token.pk).update(last_used_at=now)
    token.last_used_at = now


def token_mark_revoked(*, token: Token) -> bool:
    """Revoke ``token`` unless it already is; whether it was revoked now (its caller audits only then). The
    caller holds the token's row lock, in its transaction."""
    if token.revoked_at is not None:
        return False
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    return True


@transaction.atomic
def token_create(
    *, actor, owner, name: str, scope: str = TokenScope.READ, expires_at: datetime | None = None
) -> tuple[ApiToken, str]:
    """A new token for ``owner``. Returns the row and the token itself, which is never retrievable again."""
    require(may_manage_tokens_of(actor, owner), "You may not create tokens for this user.")
    if expires_at is not None and expires_at <= timezone.now():
        raise ServiceError("the expiry must be in the future", field="expires_at")
    token, raw = token_issue(model=ApiToken, user=owner, name=name, scope=scope, expires_at=expires_at)
    tenant_id = Membership.objects.filter(user=owner).values_list("tenant_id", flat=True).first()
    audit_record(
        actor=actor,
        action="token.create",
        target=token,
        tenant_id=tenant_id,
        changes={
            "owner": owner.get_username(),
            "name": name,
            "scope": scope,
            "expires_at": expires_at.isoformat() if expires_at else None,
        },
    )
    return token, raw


@transaction.atomic
def token_revoke(*, actor, token: ApiToken) -> ApiToken:
    token = ApiToken.objects.select_for_update().select_related("user").get(pk=token.pk)
    require(may_manage_tokens_of(actor, token.user), "You may not revoke this token.")
    if token_mark_revoked(token=token):
        tenant_id = Membership.objects.filter(user=token.user).values_list("tenant_id", flat=True).first()
        audit_record(
            actor=actor, action="token.revoke", target=token, tenant_id=tenant_id, changes={"revoked": True}
        )
        credentials_revoked(user_id=token.user_id, token_id=token.pk)  # sockets opened with it close
    return token


@transaction.atomic
def demo_admin_ensure(*, username: str) -> str | None:
    """Create the demo provider admin if missing; returns its generated password (shown once) or None."""
    if User.objects.filter(username=username).exists():
        return None
    password = secrets.token_urlsafe(12)
    user = User.objects.create_superuser(username=username, email="", password=password)
    Membership.objects.create(user=user, role=Role.PROVIDER_ADMIN)
    audit_record(
        actor=None,
        action="user.create",
        target=user,
        changes={"username": username, "role": Role.PROVIDER_ADMIN},
    )
    return password
