from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.response import Response

from controlplane.api import ScopedViewSet
from controlplane.openapi import ErrorSerializer
from simulator import selectors
from simulator.api.serializers import WhatIfRunSerializer
from simulator.services.whatifs import whatif_start
from tenancy.permissions import IsProvider


class WhatIfViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """What-if replays of a long training run through Lockstep's planner, with and without protection.
    POST a config (seed, gpus, days, profile, checkpoint_minutes, restart_overhead_minutes,
    checkpoint_write_seconds, migration_pause_seconds, migration_work_lost_minutes, spare_fraction, repair_hours,
    software_crash_share, failed_recovery_share, rack_failure_share, …); follow ``progress`` (or the ``whatif.*``
    events on the ``fleet`` topic); read ``report`` when ``state`` is done: ``unprotected`` and ``protected``
    figures, ``assumptions`` (value and source each), ``sensitivity`` and ``checkpoint_advice``."""

    serializer_class = WhatIfRunSerializer
    permission_classes = [*ScopedViewSet.permission_classes, IsProvider]
    filterset_fields = ["state"]

    def selector(self, *, user):
        return selectors.whatif_list(user=user)

    # 429: WHATIF_MAX_PER_USER or WHATIF_MAX_RUNNING replays are under way (simulator.services).
    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT},
        responses={202: WhatIfRunSerializer, 429: ErrorSerializer},
    )
    def create(self, request):
        run = whatif_start(
            actor=request.user, config=request.data if isinstance(request.data, dict) else None
        )
        return Response(WhatIfRunSerializer(run).data, status=status.HTTP_202_ACCEPTED)
