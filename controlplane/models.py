from django.conf import settings
from django.db import models


class TopicSequence(models.Model):
    """The last sequence number handed out per topic (one row per topic, bumped in the publishing transaction)."""

    topic = models.CharField(max_length=120, primary_key=True)
    last_seq = models.BigIntegerField(default=0)

    def __str__(self):
        return f"{self.topic}@{self.last_seq}"


class Event(models.Model):
    """The outbox: one row per topic an event goes to, written in the same transaction as the change."""

    topic = models.CharField(max_length=120)
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=80)
    payload = models.JSONField(default=dict)
    url = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["topic", "seq"]
        constraints = [models.UniqueConstraint(fields=["topic", "seq"], name="event_topic_seq_unique")]
        indexes = [
            models.Index(fields=["id"], condition=models.Q(sent_at__isnull=True), name="event_unsent_idx"),
        ]

    def __str__(self):
        return f"{self.topic}#{self.seq} {self.kind}"

    def as_message(self) -> dict:
        return {
            "topic": self.topic,
            "seq": self.seq,
            "kind": self.kind,
            "payload": self.payload,
            "url": self.url,
            "created": self.created_at.isoformat() if self.created_at else None,
        }


class AuditSource(models.TextChoices):
    API = "api", "API"
    PAGE = "page", "Page"
    CLI = "cli", "Command line"
    SYSTEM = "system", "System"


class AuditEntry(models.Model):
    """Who changed what, when, and how: written by services in the transaction of the change."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="audit_entries",
    )
    actor_name = models.CharField(max_length=150, blank=True)
    token_prefix = models.CharField(max_length=16, blank=True)
    source = models.CharField(max_length=10, choices=AuditSource.choices, default=AuditSource.SYSTEM)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    action = models.CharField(max_length=80)
    object_type = models.CharField(max_length=80)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    tenant_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    changes = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self):
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.object_type}:{self.object_id}"
