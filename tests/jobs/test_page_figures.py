"""Figures on the jobs and home pages read right (issue 23): dead nodes' GPUs are not healthy, uptime counts
phases still open, shares are percentages, numbers have thousands separators, one date format, words are
spelled as words, empty charts are empty states, and the live panels render their history."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from controlplane import events
from controlplane.templatetags.figures import number, ordinal_batch, percent, when
from fleet.choices import NodeState
from jobs.choices import ActionState, JobPhaseKind
from jobs.models import Job, JobPhase, RecoveryAction
from tests.support.factories import make_cluster
from tests.support.jobs import bulk_nodes, protected_cluster, submit

pytestmark = pytest.mark.django_db


def test_the_filters_write_numbers_shares_and_dates_one_way():
    assert number(2595014.2, 1) == "2,595,014.2" and number(2304) == "2,304" and number(-0.001, 2) == "0.00"
    assert number(None) == "—" and number("x") == "—"
    assert percent(0.99) == "99.0 %" and percent(0.8765, 2) == "87.65 %" and percent(None) == "—"
    moment = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    assert when(moment) == '<time datetime="2026-03-04T05:06:07+00:00">2026-03-04 05:06:07</time>'
    assert when(None) == "—"
    assert ordinal_batch(0) == "1" and ordinal_batch(-1) == "—"


def test_failed_nodes_gpus_are_not_counted_healthy_and_big_numbers_have_separators(client, users):
    cluster = make_cluster(name="big")
    nodes = bulk_nodes(cluster, 300, prefix="big-n")  # 2,400 GPUs
    dead = [n.pk for n in nodes[:8]]
    type(nodes[0]).objects.filter(pk__in=dead).update(state=NodeState.FAILED)
    client.force_login(users["operator"])
    html = client.get("/").content.decode()
    healthy = re.search(r'id="fig-gpus-healthy" data-value="(\d+)">([^<]+)</span> / ([^<]+)</span>', html)
    assert healthy.groups() == ("2336", "2,336", "2,400")  # 2,400 less the 64 GPUs of 8 failed nodes


def test_empty_charts_are_empty_states_and_live_events_show_history(client, users, tenant_a, tenant_b):
    with transaction.atomic():
        events.publish(["fleet"], "node.cordoned", {"node": 1, "hostname": "h-one", "state": "cordoned"})
        events.publish(
            ["fleet", f"tenant-{tenant_a.pk}"], "job.state", {"job": 1, "name": "mine", "state": "Running"}
        )
        events.publish(
            [f"tenant-{tenant_b.pk}"], "job.state", {"job": 2, "name": "theirs", "state": "Running"}
        )
    client.force_login(users["operator"])
    html = client.get("/").content.decode()
    assert re.search(r'<p class="empty" id="chart-faults-empty">No faults', html)
    assert re.search(r'id="chart-faults" class="chart"[^>]* hidden', html)
    assert re.search(r'<p class="empty" id="chart-saved-empty">', html)
    feed = html[html.index('id="event-feed"') : html.index("</ol>", html.index('id="event-feed"'))]
    assert feed.index("job.state") < feed.index("node.cordoned") and "h-one" in feed  # newest first
    assert re.search(r'<li data-seq="\d+"><time datetime="[^"]+">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</time>', feed)
    client.force_login(users["tenant-viewer"])
    feed = client.get("/").content.decode()
    feed = feed[feed.index('id="event-feed"') :]
    feed = feed[: feed.index("</ol>")]
    assert "mine" in feed and "theirs" not in feed and "h-one" not in feed


def test_the_connection_badge_is_hidden_until_a_page_goes_live(client, users):
    client.force_login(users["operator"])
    html = client.get("/tokens/").content.decode()
    assert re.search(r'<span class="live-state" id="live-state"[^>]* hidden>', html)


def test_tenant_uptime_counts_open_phases_and_reads_as_a_percentage(client, users, tenant_a):
    cluster = protected_cluster(nodes=4, spares=0)
    job = submit(cluster, tenant_a, gpus=8)
    JobPhase.objects.filter(job=job).delete()
    now = timezone.now()
    JobPhase.objects.bulk_create(
        [
            # running from 40 days ago to 20 days ago: 10 of those days fall in the window
            JobPhase(
                job=job,
                kind=JobPhaseKind.RUNNING,
                started_at=now - timedelta(days=40),
                ended_at=now - timedelta(days=20),
            ),
            JobPhase(
                job=job,
                kind=JobPhaseKind.RUNNING,
                started_at=now - timedelta(days=20),
                ended_at=now - timedelta(days=2),
            ),
            JobPhase(
                job=job,
                kind=JobPhaseKind.RECOVERING,
                started_at=now - timedelta(days=2),
                ended_at=now - timedelta(days=2) + timedelta(hours=1),
            ),
            JobPhase(
                job=job,
                kind=JobPhaseKind.RUNNING,
                started_at=now - timedelta(days=2) + timedelta(hours=1),
                ended_at=now - timedelta(hours=5),
            ),
            JobPhase(
                job=job, kind=JobPhaseKind.RECOVERING, started_at=now - timedelta(hours=5)
            ),  # still open
        ]
    )
    client.force_login(users["tenant-viewer"])
    html = client.get("/").content.decode()
    running = 10 * 24 + 18 * 24 + (48 - 1 - 5)  # hours
    recovering = 1 + 5
    expected = running / (running + recovering)
    shown = re.search(r'id="fig-uptime">([^<]+)<', html).group(1)
    assert shown == f"{expected * 100:.1f} %" and shown == "99.2 %"


def test_job_page_figures_and_its_empty_recovery_table(client, users, tenant_a):
    cluster = protected_cluster(nodes=4, spares=1, name="eu-a")
    job = submit(cluster, tenant_a, gpus=16, name="llama-70b")
    client.force_login(users["tenant-viewer"])
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert (
        "<title>llama-70b on eu-a · Lockstep</title>" in html and '<span class="muted">on eu-a</span>' in html
    )
    assert "No recovery actions for this job yet" in html and "No faults have touched this job" not in html
    RecoveryAction.objects.create(
        job=job,
        cluster=cluster,
        kind="live_migration",
        state=ActionState.SUCCEEDED,
        detected_at=timezone.now(),
        started_at=timezone.now(),
        ended_at=timezone.now(),
        gpus=16,
        pause_seconds=1234.5,
        work_lost_seconds=0.0,
        restore_iteration=123456,
        gpu_hours_saved=2595014.2,
    )
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    table = html[html.index('id="action-table"') :]
    table = table[: table.index("</table>")]
    assert "1,234.5" in table and "123,456" in table and "2,595,014.20" in table
    assert 'data-state="succeeded"' in table and "No recovery actions" not in table


def test_job_list_headers_and_numbers(client, users, tenant_a):
    cluster = protected_cluster(nodes=4, spares=0)
    submit(cluster, tenant_a, gpus=16)
    client.force_login(users["tenant-viewer"])
    html = client.get("/jobs/").content.decode()
    assert ">GPUs<" in html and "Gpus" not in html


def test_fault_overview_empty_chart_is_an_empty_state(client, users):
    client.force_login(users["operator"])
    html = client.get("/faults/").content.decode()
    assert re.search(r'id="saved-chart" class="chart"[^>]* hidden', html)
    assert re.search(r'<p class="empty" id="saved-chart-empty">', html)


def test_prediction_figures_are_percentages_and_plurals_agree(client, users, monkeypatch):
    import telemetry.views

    metrics = {
        "precision": 0.878,
        "chance_precision": 0.0412,
        "precision_lift": 21.3,
        "recall": 0.5,
        "judged": 1,
        "emptied": 0,
        "failures": 1,
        "chance_recall": 0.003,
        "recall_lift": 166.7,
        "lead_time_median_seconds": 12345.0,
        "horizon_fault_model_hours": 24,
        "horizon_seconds": 144,
    }
    monkeypatch.setattr(telemetry.views, "prediction_metrics", lambda: metrics)
    client.force_login(users["operator"])
    html = client.get("/predictions/").content.decode()
    assert "87.8 %" in html and "4.1 %" in html and "50.0 %" in html and "0.878" not in html
    assert "1 prediction judged" in html and "1 predictions" not in html and "of 1 hardware failure;" in html
    assert "12,345 s" in html


def test_job_names_can_be_told_apart_across_clusters(client, users, tenant_a):
    first, second = (
        protected_cluster(nodes=2, spares=0, name="us-a"),
        protected_cluster(nodes=2, spares=0, name="us-b"),
    )
    a, b = submit(first, tenant_a, gpus=8, name="pretrain"), submit(second, tenant_a, gpus=8, name="pretrain")
    client.force_login(users["tenant-viewer"])
    for job, cluster in ((a, "us-a"), (b, "us-b")):
        assert (
            f'<h1>pretrain <span class="muted">on {cluster}</span>'
            in client.get(f"/jobs/{job.pk}/").content.decode()
        )
    assert Job.objects.filter(name="pretrain").count() == 2


def test_the_demo_world_gives_every_job_its_own_name():
    from simulator.world import world_build

    world_build(seed=3, nodes_per_cluster=32, spares=4)
    names = list(Job.objects.values_list("name", flat=True))
    assert len(names) > 4 and len(names) == len(set(names))
