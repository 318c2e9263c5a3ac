"""Blueprint sources: a git repository, branch or tag and path whose commits become a blueprint's versions."""

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from controlplane.security_crypto import EncryptedJSONField
from fleet.models.blueprints import Blueprint, BlueprintVersion


class BlueprintSource(models.Model):
    """Where a blueprint's versions come from. Each commit on ``ref`` that changes the document at ``path`` becomes
    a draft version (activated at once when ``auto_activate``); polled every ``poll_seconds`` and on push webhooks."""

    blueprint = models.OneToOneField(Blueprint, on_delete=models.CASCADE, related_name="source")
    url = models.CharField(max_length=2048)
    ref = models.CharField(max_length=255, default="main", help_text="a branch or tag")
    path = models.CharField(max_length=1024, default="blueprint.yaml")
    # {"username": ..., "password": ...} (a token as the password): encrypted at rest like cluster credentials.
    credentials = EncryptedJSONField(default=dict, blank=True)
    # The shared secret of push webhooks (GitHub's HMAC key, GitLab's token); encrypted at rest.
    webhook_secret = EncryptedJSONField(default=str, blank=True)
    poll_seconds = models.PositiveIntegerField(
        default=300, validators=[MinValueValidator(10), MaxValueValidator(7 * 86400)]
    )
    auto_activate = models.BooleanField(default=False)
    next_poll_at = models.DateTimeField(null=True, blank=True, db_index=True)
    last_polled_at = models.DateTimeField(null=True, blank=True)
    last_commit = models.CharField(max_length=64, blank=True)
    # Why the last poll failed (unreachable, refused URL, no such ref); empty after a good poll.
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["blueprint_id"]

    def __str__(self):
        return f"{self.blueprint.name} from {self.url}@{self.ref}:{self.path}"


class SourceCommit(models.Model):
    """A commit that changed the source's document: the draft it became, or why it did not (``error``)."""

    source = models.ForeignKey(BlueprintSource, on_delete=models.CASCADE, related_name="commits")
    sha = models.CharField(max_length=64)
    author = models.CharField(max_length=300, blank=True)
    message = models.TextField(blank=True)
    committed_at = models.DateTimeField(null=True, blank=True)
    version = models.OneToOneField(
        BlueprintVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="commit"
    )
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["source", "sha"], name="source_commit_unique")]

    def __str__(self):
        return f"{self.sha[:12]} of {self.source_id}"
