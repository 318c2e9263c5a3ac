"""Is it the fabric? The three cases the simulator's fabric produces, and a clean path."""

import time

import pytest

from telemetry.diagnosis import diagnose
from telemetry.models import GPUState, NICState

pytestmark = pytest.mark.django_db


def test_a_port_with_rising_errors_while_its_link_stays_up_is_named(job):
    NICState.objects.filter(node__hostname="h1", nic__name="mlx5_3").update(symbol_rate=40_000.0)
    found = diagnose(job)
    assert found["fabric"] is True and found["where"] == "nic"
    assert found["culprit"].startswith("h1/mlx5_3") and "symbol errors" in found["summary"]
    assert found["slowness"]["slow"] is True and found["slowness"]["ratio"] == pytest.approx(2.45 / 2.0)


def test_micro_congestion_on_one_rail_points_at_the_rail(job):
    NICState.objects.filter(node__hostname__in=["h0", "h4"], nic__name="mlx5_6").update(
        congestion_rate=900_000.0
    )
    found = diagnose(job)
    assert found["fabric"] is True and found["where"] == "rail" and found["culprit"] == "rail 6"
    assert any("congestion" in e for f in found["findings"] for e in f["evidence"])


def test_a_slow_gpu_rules_the_fabric_out(job):
    GPUState.objects.filter(node__hostname="h5", gpu__index=2).update(
        throttle_share=0.8, temperature=88.0, utilization=60.0
    )
    found = diagnose(job)
    assert found["fabric"] is False and found["culprit"] == "h5/gpu2"
    assert found["summary"].startswith("Not the fabric")


def test_a_clean_path_says_nothing_stands_out(job):
    found = diagnose(job)
    assert found["fabric"] is False and found["culprit"] is None


def test_trouble_off_the_path_is_not_blamed(job):
    NICState.objects.filter(node__hostname="h7").update(symbol_rate=90_000.0)  # h7 is not the job's
    assert diagnose(job)["culprit"] is None


def test_diagnosis_api_answers_within_a_second_and_follows_job_visibility(api, users, job):
    NICState.objects.filter(node__hostname="h1", nic__name="mlx5_3").update(symbol_rate=40_000.0)
    api.as_token(users["tenant-viewer"], "read")
    started = time.perf_counter()
    response = api.get(f"/api/v1/jobs/{job.pk}/diagnosis/")
    assert response.status_code == 200 and time.perf_counter() - started < 1.0
    assert response.json()["culprit"].startswith("h1/mlx5_3")
    api.as_token(users["other-viewer"], "read")
    assert api.get(f"/api/v1/jobs/{job.pk}/diagnosis/").status_code == 404


def test_fabric_view_colours_the_leaf_and_rail_that_stand_out(client, users, job):
    NICState.objects.filter(node__hostname="h1", nic__name="mlx5_3").update(symbol_rate=40_000.0)
    client.force_login(users["operator"])
    page = client.get(f"/fabric/{job.cluster_id}/").content.decode()
    assert page.count("cell-bad") == 1 and "h1/mlx5_3" in page
    client.force_login(users["other-viewer"])
    assert client.get(f"/fabric/{job.cluster_id}/").status_code == 404


def test_job_page_carries_the_diagnosis_panel(client, users, job):
    client.force_login(users["tenant-viewer"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "Why is this job slow?" in page and f"/api/v1/jobs/{job.pk}/diagnosis/" in page
