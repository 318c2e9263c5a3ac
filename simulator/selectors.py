from django.db.models import QuerySet

from controlplane.access import principal
from simulator.models import WhatIfRun


def whatif_list(*, user) -> QuerySet[WhatIfRun]:
    """What-if runs are fleet-wide analysis: provider roles only."""
    return WhatIfRun.objects.all() if principal(user).is_provider else WhatIfRun.objects.none()
