from django.db.models import QuerySet

from simulator.models import Scenario, WhatIfRun
from tenancy.scoping import restrict


def whatif_list(*, user) -> QuerySet[WhatIfRun]:
    """What-if runs are fleet-wide analysis: provider roles only."""
    return restrict(WhatIfRun.objects.all(), user)


def scenario_list(*, user) -> QuerySet[Scenario]:
    """Scenarios run jobs on the shared clusters for the demo: provider roles only."""
    return restrict(Scenario.objects.all(), user)


def scenario_jobs(*, user, scenario: Scenario) -> dict:
    """A scenario's jobs by label (``protected``, ``unprotected``), each with its cluster."""
    from jobs.selectors import job_list

    return {label: job_list(user=user).get(pk=job_id) for label, job_id in scenario.jobs.items()}
