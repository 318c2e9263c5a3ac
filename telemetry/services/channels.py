"""Notification channels: created, changed and removed by the provider admin, audited.

A channel's URL is where the workers will POST from inside the installation, so it passes controlplane.outbound's
check when it is saved (its form, and the addresses it names literally) and again when each delivery is sent
(resolved once and connected to as checked): what only the installation can reach is refused (SSRF).
"""

from django.db import transaction

from controlplane.access import principal, require
from controlplane.audit import audit_record, field_changes
from controlplane.errors import ServiceError
from controlplane.outbound import OutboundRefused, check_url
from telemetry.models import NotificationChannel


def _require_target(url: str) -> None:
    try:
        check_url(url, resolve=False)  # the name is resolved when a delivery is sent, not now
    except OutboundRefused as refusal:
        raise ServiceError(str(refusal), field="url") from None


def _require_admin(actor) -> None:
    require(principal(actor).is_provider_admin, "Only the provider admin may change notification channels.")


@transaction.atomic
def channel_create(*, actor, name: str, url: str, kind: str = "generic", rules=None, enabled: bool = True):
    _require_admin(actor)
    if NotificationChannel.objects.filter(name=name).exists():
        raise ServiceError("a channel with this name exists", field="name")
    _require_target(url)
    channel = NotificationChannel.objects.create(
        name=name, url=url, kind=kind, rules=rules or [], enabled=enabled
    )
    audit_record(
        actor=actor,
        action="notification_channel.create",
        target=channel,
        changes={"name": name, "kind": kind, "rules": rules or [], "enabled": enabled},
    )
    return channel


@transaction.atomic
def channel_update(*, actor, channel: NotificationChannel, **fields):
    _require_admin(actor)
    channel = NotificationChannel.objects.select_for_update().get(pk=channel.pk)
    if (
        "name" in fields
        and NotificationChannel.objects.filter(name=fields["name"]).exclude(pk=channel.pk).exists()
    ):
        raise ServiceError("a channel with this name exists", field="name")
    if "url" in fields:
        _require_target(fields["url"])
    changes = field_changes(channel, fields)
    for name, value in fields.items():
        setattr(channel, name, value)
    channel.save()
    if changes:
        audit_record(actor=actor, action="notification_channel.update", target=channel, changes=changes)
    return channel


@transaction.atomic
def channel_delete(*, actor, channel: NotificationChannel) -> None:
    _require_admin(actor)
    audit_record(
        actor=actor, action="notification_channel.delete", target=channel, changes={"name": channel.name}
    )
    channel.delete()
