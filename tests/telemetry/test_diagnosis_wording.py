"""A job that is not slow is told so, not answered "Not the fabric" to a question nobody asked (issue 23)."""

import pytest

from jobs.services.jobs import job_progress
from telemetry.diagnosis import diagnose
from telemetry.models import NICState

pytestmark = pytest.mark.django_db


def _steady(job):  # noqa: F811
    for i in range(5):
        job_progress(job=job, iteration=200 + 50 * i, step_seconds=2.0)


def test_a_job_at_its_own_pace_is_not_slow(job):  # noqa: F811
    _steady(job)
    found = diagnose(job)
    assert found["slowness"]["slow"] is False
    assert found["summary"].startswith("Not slow: step time 2.00 s against its own best 2.00 s")
    assert "Not the fabric" not in found["summary"]


def test_a_job_not_slow_still_hears_what_stands_out_on_its_path(job):  # noqa: F811
    _steady(job)
    NICState.objects.filter(node__hostname="h1", nic__name="mlx5_3").update(symbol_rate=40_000.0)
    found = diagnose(job)
    assert found["summary"].startswith("Not slow:") and "Still, the fabric: h1/mlx5_3" in found["summary"]


def test_a_slow_job_keeps_its_verdict(job):  # noqa: F811
    assert diagnose(job)["summary"].startswith("Not the fabric")
