"""The telemetry API's serializers: agent tokens, notification channels and deliveries, predictions."""

from rest_framework import serializers

from controlplane.outbound import OutboundRefused, check_url
from telemetry.models import NotificationChannel
from telemetry.services.notifications import RULES
from tenancy.api.serializers import ClusterTokenSerializer


class AgentTokenSerializer(ClusterTokenSerializer):
    pass


class AgentTokenCreatedSerializer(AgentTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="shown once; only its digest is stored")


class NotificationChannelSerializer(serializers.ModelSerializer):
    # Not Django's URLValidator: the one outbound check says what is wrong (controlplane/outbound.py).
    url = serializers.CharField(max_length=500)
    rules = serializers.ListField(child=serializers.ChoiceField(choices=sorted(RULES)), required=False)

    def validate_url(self, value: str) -> str:
        try:
            check_url(value, resolve=False)
        except OutboundRefused as refusal:
            raise serializers.ValidationError(str(refusal)) from None
        return value

    class Meta:
        model = NotificationChannel
        fields = ["id", "name", "kind", "url", "rules", "enabled", "created_at"]
        read_only_fields = ["id", "created_at"]


class NotificationDeliverySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    channel = serializers.CharField(source="channel.name")
    rule = serializers.CharField()
    summary = serializers.CharField()
    state = serializers.CharField()
    attempts = serializers.IntegerField()
    last_status = serializers.IntegerField(allow_null=True)
    last_error = serializers.CharField()
    created_at = serializers.DateTimeField()
    delivered_at = serializers.DateTimeField(allow_null=True)
    next_attempt_at = serializers.DateTimeField()


class PredictionSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    node = serializers.IntegerField(source="node_id")
    hostname = serializers.CharField(source="node.hostname")
    cluster = serializers.IntegerField(source="cluster_id")
    score = serializers.FloatField()
    threshold = serializers.FloatField()
    horizon_hours = serializers.FloatField()
    predicted_at = serializers.DateTimeField()
    cause = serializers.CharField()
    cause_kind = serializers.CharField()
    evidence = serializers.JSONField()
    fault = serializers.IntegerField(source="fault_id", allow_null=True)
    action_taken = serializers.CharField()
    outcome = serializers.CharField()
    outcome_at = serializers.DateTimeField(allow_null=True)
    failure = serializers.IntegerField(source="failure_id", allow_null=True)
    lead_seconds = serializers.FloatField(allow_null=True)
