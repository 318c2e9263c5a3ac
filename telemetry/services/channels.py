"""Notification channels: created, changed and removed by the provider admin, audited.

A channel's URL is where the workers will POST from inside the installation, so it must not reach what only the
installation can reach (SSRF): loopback, link-local (cloud metadata at 169.254.169.254), private and other
non-global addresses are refused, when the channel is saved and again before each delivery (the name may
resolve elsewhere by then), unless NOTIFICATION_ALLOW_PRIVATE_TARGETS is on.
"""

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction

from controlplane.access import principal, require
from controlplane.audit import audit_record, field_changes
from controlplane.errors import ServiceError
from telemetry.models import NotificationChannel


def target_problem(url: str, *, unresolved_ok: bool = False) -> str | None:
    """Why Lockstep will not post to ``url``, or None when it may. ``unresolved_ok``: a name that does not resolve
    now is no reason to refuse it (saving a channel); before a delivery it is."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "not a valid URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http:// or https:// URL with a host"
    if settings.NOTIFICATION_ALLOW_PRIVATE_TARGETS:
        return None
    try:
        addresses = {
            info[4][0] for info in socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
        }
    except (OSError, UnicodeError):
        return None if unresolved_ok else f"the host {parts.hostname} does not resolve"
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if not ip.is_global or ip.is_multicast:
            return (
                f"{parts.hostname} resolves to {ip}, a loopback, link-local or private address "
                "(NOTIFICATION_ALLOW_PRIVATE_TARGETS allows it)"
            )
    return None


def _require_target(url: str) -> None:
    problem = target_problem(url, unresolved_ok=True)
    if problem:
        raise ServiceError(problem, field="url")


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
