from django.db import models


class NotificationChannelKind(models.TextChoices):
    GENERIC = "generic", "Generic JSON webhook"
    SLACK = "slack", "Slack-compatible webhook"


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"


class PredictionOutcome(models.TextChoices):
    OPEN = "open", "Open"
    FAILED = "failed", "Failed within the horizon"
    HELD = "held", "Did not fail within the horizon"
