from django.db.models import QuerySet

from controlplane.access import principal
from telemetry.models import AgentToken


def agent_token_list(*, user) -> QuerySet[AgentToken]:
    """Agent tokens are cluster credentials: provider roles only."""
    if not principal(user).is_provider:
        return AgentToken.objects.none()
    return AgentToken.objects.select_related("cluster")


def notification_channel_list(*, user):
    from telemetry.models import NotificationChannel

    return NotificationChannel.objects.all() if principal(user).is_provider else NotificationChannel.objects.none()


def notification_delivery_list(*, user):
    from telemetry.models import NotificationDelivery

    if not principal(user).is_provider:
        return NotificationDelivery.objects.none()
    return NotificationDelivery.objects.select_related("channel")
