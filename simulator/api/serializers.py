"""The what-if API's serializer."""

from rest_framework import serializers

from simulator.models import WhatIfRun


class WhatIfRunSerializer(serializers.ModelSerializer):
    class Meta:
        model = WhatIfRun
        fields = [
            "id",
            "state",
            "progress",
            "config",
            "report",
            "error",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields
