"""The provider-wide automation switch: ``GET /api/v1/automation/`` (provider roles), ``PUT`` (the provider admin any mode; an operator dry-run or paused)."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.access import principal, require
from controlplane.openapi import ErrorSerializer
from fleet.choices import AutomationMode
from fleet.services.automation import automation_switch, automation_switch_set


class AutomationSwitchSerializer(serializers.Serializer):
    mode = serializers.ChoiceField(
        choices=AutomationMode.choices,
        help_text="active; dry-run (everything decides and records only); paused (nothing acts)",
    )
    reason = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")
    changed_by = serializers.CharField(
        read_only=True, source="changed_by.username", default=None, allow_null=True
    )
    changed_at = serializers.DateTimeField(read_only=True, allow_null=True)


class AutomationSwitchView(APIView):
    """One switch over all automation everywhere: fault recovery, the escalation ladder, drift correction and
    rollout steps. Every cluster runs at the strictest of its own mode, its fleet's and this one."""

    def _provider(self, request):
        require(
            principal(request.user).is_provider, "only provider roles see the provider-wide automation switch"
        )

    @extend_schema(responses={200: AutomationSwitchSerializer, 403: ErrorSerializer})
    def get(self, request):
        self._provider(request)
        return Response(AutomationSwitchSerializer(automation_switch()).data)

    @extend_schema(
        request=AutomationSwitchSerializer,
        responses={200: AutomationSwitchSerializer, 403: ErrorSerializer},  # 400: field errors (openapi.py)
    )
    def put(self, request):
        self._provider(request)  # who may set which mode: automation_switch_set (DESIGN's table)
        data = AutomationSwitchSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        switch = automation_switch_set(
            actor=request.user, mode=data.validated_data["mode"], reason=data.validated_data.get("reason", "")
        )
        return Response(AutomationSwitchSerializer(switch).data)
