"""Blueprint sources in the API: what is shown (never the credentials or the webhook secret) and what is taken."""

from rest_framework import serializers

from fleet.models import BlueprintSource, SourceCommit


class SourceCommitSerializer(serializers.ModelSerializer):
    version = serializers.IntegerField(source="version.number", read_only=True, default=None, allow_null=True)

    class Meta:
        model = SourceCommit
        fields = ["sha", "author", "message", "committed_at", "version", "error", "created_at"]
        read_only_fields = fields


class BlueprintSourceSerializer(serializers.ModelSerializer):
    has_credentials = serializers.SerializerMethodField()
    has_webhook_secret = serializers.SerializerMethodField()
    webhook_url = serializers.SerializerMethodField(help_text="where GitHub or GitLab sends push events")
    commits = serializers.SerializerMethodField(help_text="the newest commits that changed the document")

    class Meta:
        model = BlueprintSource
        fields = [
            "url",
            "ref",
            "path",
            "poll_seconds",
            "auto_activate",
            "has_credentials",
            "has_webhook_secret",
            "webhook_url",
            "next_poll_at",
            "last_polled_at",
            "last_commit",
            "last_error",
            "commits",
        ]
        read_only_fields = fields

    def get_has_credentials(self, source) -> bool:
        return bool((source.credentials or {}).get("password"))

    def get_has_webhook_secret(self, source) -> bool:
        return bool(source.webhook_secret)

    def get_webhook_url(self, source) -> str:
        return f"/api/v1/blueprint-sources/{source.pk}/webhook/"

    def get_commits(self, source) -> list[dict]:
        rows = source.commits.select_related("version")[:20]
        return SourceCommitSerializer(rows, many=True).data


class BlueprintSourceWriteSerializer(serializers.Serializer):
    """Shapes only; the service checks the URL (outbound rule), ref, path and secrets and names the field."""

    url = serializers.CharField(required=False, max_length=2048)
    ref = serializers.CharField(required=False, max_length=255)
    path = serializers.CharField(required=False, max_length=1024)
    credentials = serializers.JSONField(required=False, help_text='{"username": "...", "password": "token"}')
    webhook_secret = serializers.CharField(required=False, allow_blank=True, max_length=1024)
    poll_seconds = serializers.IntegerField(required=False)
    auto_activate = serializers.BooleanField(required=False)
