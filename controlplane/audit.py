"""The audit trail: services call ``audit_record`` inside the transaction of the change they make."""

import logging

from django.core.cache import cache
from django.db import models, transaction
from redis.exceptions import RedisError

from controlplane import context
from controlplane.bulk import insert_rows
from controlplane.models import AuditEntry


def audit_record(
    *,
    actor,
    action: str,
    target: models.Model | None = None,
    object_type: str = "",
    object_id: str = "",
    changes: dict | None = None,
    tenant_id: int | None = None,
) -> AuditEntry:
    """Record who did what to which object, with the change; the source comes from the request context."""
    entry = audit_entry(
        actor=actor,
        action=action,
        target=target,
        object_type=object_type,
        object_id=object_id,
        changes=changes,
        tenant_id=tenant_id,
    )
    audit_record_many([entry])
    return entry


log = logging.getLogger(__name__)


def audit_record_sampled(*, key: str, seconds: int, always: bool = False, **fields) -> AuditEntry | None:
    """``audit_record`` for writes too frequent to keep each (a job's progress reports, refused logins): the first
    under ``key`` in each ``seconds`` is recorded, and every one with ``always``. Returns the entry, or None when
    the window already has one. The key is remembered in the cache (Redis) once the entry is committed; when the
    cache cannot answer, the entry is recorded (an entry too many, never one too few)."""
    cache_key = f"audit-sampled:{key}"
    if not always:
        try:
            if cache.get(cache_key) is not None:
                return None
        except RedisError as error:
            log.warning("audit sampling not consulted, Redis unreachable: %r", error)
    entry = audit_record(**fields)

    def remember():
        try:
            cache.set(cache_key, 1, timeout=seconds)
        except RedisError as error:
            log.warning("audit sampling not remembered, Redis unreachable: %r", error)

    transaction.on_commit(remember)
    return entry


def audit_entry(
    *,
    actor,
    action: str,
    target: models.Model | None = None,
    object_type: str = "",
    object_id: str = "",
    changes: dict | None = None,
    tenant_id: int | None = None,
) -> AuditEntry:
    """The audit entry ``audit_record`` would write, unsaved: a service that changes many objects at once
    builds one per object and writes them together with ``audit_record_many``."""
    ctx = context.current()
    if target is not None:
        object_type = object_type or target._meta.label_lower
        object_id = object_id or str(target.pk)
    real_actor = actor if getattr(actor, "is_authenticated", False) else None
    return AuditEntry(
        actor=real_actor,
        actor_name=real_actor.get_username() if real_actor else "system",
        token_prefix=ctx.token_prefix,
        source=ctx.source,
        remote_addr=ctx.remote_addr,
        action=action,
        object_type=object_type,
        object_id=object_id,
        object_repr=str(target)[:200] if target is not None else "",
        tenant_id=tenant_id,
        changes=changes or {},
    )


def audit_record_many(entries: list[AuditEntry]) -> list[AuditEntry]:
    """Write audit entries built by ``audit_entry``, in one statement."""
    return insert_rows(entries)


def field_changes(instance: models.Model, fields: dict) -> dict:
    """``{"field": [old, new]}`` for the fields whose value differs (JSON-safe via str for odd types)."""
    changed = {}
    for name, new in fields.items():
        old = getattr(instance, name)
        if old != new:
            changed[name] = [_plain(old), _plain(new)]
    return changed


def _plain(value):
    if value is None or isinstance(value, bool | int | float | str | list | dict):
        return value
    return str(value)


def audit_prune(*, days: int | None = None) -> int:
    """Delete audit entries older than the retention period; returns how many."""
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    days = settings.AUDIT_RETENTION_DAYS if days is None else days
    deleted, _ = AuditEntry.objects.filter(created_at__lt=timezone.now() - timedelta(days=days)).delete()
    return deleted
