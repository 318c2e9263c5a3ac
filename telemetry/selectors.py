from django.db.models import QuerySet

from controlplane.access import principal
from telemetry.models import AgentToken
from tenancy.scoping import restrict

# Every table here is the provider's (none has a ``tenant_scope``): ``restrict`` gives tenant users none.


def agent_token_list(*, user) -> QuerySet[AgentToken]:
    """Agent tokens are cluster credentials: provider roles only."""
    return restrict(AgentToken.objects.select_related("cluster"), user)


def notification_channel_list(*, user):
    from telemetry.models import NotificationChannel

    return restrict(NotificationChannel.objects.all(), user)


def notification_delivery_list(*, user):
    from telemetry.models import NotificationDelivery

    return restrict(NotificationDelivery.objects.select_related("channel"), user)


def prediction_list(*, user):
    from telemetry.models import Prediction

    return restrict(Prediction.objects.select_related("node"), user)


def risk_ranking(*, user, per_cluster: int = 15) -> list[dict]:
    """Per cluster, its riskiest nodes with their recent scores (for sparklines): provider roles."""
    from datetime import timedelta

    from django.utils import timezone

    from fleet.models import Cluster, Node
    from telemetry.models import RiskSample

    if not principal(user).is_provider:
        return []
    out = []
    since = timezone.now() - timedelta(hours=24)
    for cluster in Cluster.objects.order_by("name"):
        nodes = list(Node.objects.filter(cluster=cluster).order_by("-risk_score", "hostname")[:per_cluster])
        history: dict[int, list[float]] = {node.pk: [] for node in nodes}
        for node_id, score in (
            RiskSample.objects.filter(node_id__in=history.keys(), ts__gte=since)
            .order_by("ts")
            .values_list("node_id", "score")
        ):
            history[node_id].append(score)
        out.append(
            {"cluster": cluster, "nodes": [{"node": node, "history": history[node.pk]} for node in nodes]}
        )
    return out
