from django.db.models import QuerySet

from controlplane.access import principal
from telemetry.models import AgentToken


def agent_token_list(*, user) -> QuerySet[AgentToken]:
    """Agent tokens are cluster credentials: provider roles only."""
    if not principal(user).is_provider:
        return AgentToken.objects.none()
    return AgentToken.objects.select_related("cluster")
