"""In-job recovery with Lockstep driving, on a real Slurm with the real PyTorch job (issue 49): the runtime's own
report of a lost peer opens the node's incident, Lockstep decides rank_replacement (priced beside the others),
drains the dead node with the incident's reason, books what the runtime measured and starts a new standby on the
spare partition. The runtime alone (no Lockstep) is tests/slurm/test_in_job_recovery.py."""

import json
from datetime import UTC, datetime

import pytest

from jobs.choices import ActionKind, FaultSource, IncidentState, JobState
from jobs.launchers import launcher_credential_create
from jobs.models import Incident, Job, JobAllocation, JobProgress, JobStandby, RecoveryAction

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def live(tmp_path):
    from tests.support.browser import SERVER_ENV
    from tests.support.processes import uvicorn_server

    with uvicorn_server(tmp_path, **SERVER_ENV) as running:
        yield running


@pytest.fixture
def standby_env(monkeypatch):
    """The standby Lockstep starts runs the job's batch script with the submitter's environment: the Python with
    torch and the agent, as a cluster's login environment would name them."""
    import sys

    from jobs.local_slurm.training import AGENT_DIR

    monkeypatch.setenv("LOCKSTEP_PYTHON", sys.executable)
    monkeypatch.setenv("PYTHONPATH", str(AGENT_DIR))


def test_lockstep_replaces_a_lost_rank_in_place_books_it_and_starts_a_new_standby(
    standby_slurm, standby_cluster, live, standby_env, tmp_path
):
    pytest.importorskip("torch", reason="the training job needs torch (CPU wheel)")
    from tests.support.slurm_scenario import in_job_with_lockstep

    slurm, cluster = standby_slurm, standby_cluster
    _, token = launcher_credential_create(actor=None, cluster=cluster, name="train")
    run = in_job_with_lockstep(slurm, cluster, tmp_path / "run", launcher_token=token, url=live.url)
    job, action, fault = run["job"], run["action"], run["fault"]
    folder = tmp_path / "run" / "ckpt" / "ranks" / "0"

    # The survivor kept its process; the standby on n3 is rank 1 now; nothing was requeued.
    survivor = json.loads((folder / "gen1-rank0.json").read_text())
    assert run["node"] == "n2" and survivor["pid"] == next(r["pid"] for r in run["before"] if r["rank"] == 0)
    assert json.loads((folder / "gen1-rank1.json").read_text())["node"] == "n3"
    assert not (tmp_path / "run" / "ckpt" / "ranks" / "1").exists()
    assert RecoveryAction.objects.filter(job=job).exclude(kind=ActionKind.RANK_REPLACEMENT).count() == 0
    assert job.state == JobState.RUNNING

    # One incident for n2, opened by whichever reported first (the runtime, well before Slurm's ping fails).
    assert FaultSource.RUNTIME in fault.sources, fault.sources
    assert Incident.objects.filter(node=fault.node, state=IncidentState.OPEN).count() == 1
    assert {f.incident_id for f in run["faults"]} == {fault.incident_id}
    n2 = next(n for n in json.loads(slurm.run("sinfo", "--json").stdout)["nodes"] if n["name"] == "n2")
    assert "DRAIN" in n2["state_flags"] and f"lockstep: incident {fault.incident_id}" in n2["reason"], n2

    # Decided by Lockstep, priced beside the others, and booked from what the runtime measured.
    assert action.incident_id == fault.incident_id and action.state == "succeeded", action.reason
    considered = {option["kind"] for option in action.alternatives}
    assert {ActionKind.RANK_REPLACEMENT, ActionKind.RESTART_FROM_CHECKPOINT} <= considered, considered
    replaced = run["rank_replaced"]
    assert replaced["survivor_pids"] == {"0": survivor["pid"]} and replaced["lost_iterations"] <= 1
    assert action.restore_iteration == replaced["iteration"]
    steps = [p.step_seconds for p in JobProgress.objects.filter(job=job, step_seconds__isnull=False)]
    steps.append(Job._meta.get_field("seconds_per_iteration").default)  # a moving average of these, from this
    lost = replaced["lost_iterations"]
    assert lost * min(steps) - 1e-6 <= action.work_lost_seconds <= lost * max(steps) + 1e-6
    assert 0 < action.pause_seconds <= replaced["at"] - run["killed_at"] + 1.0, action.pause_seconds
    assert action.estimate["restart_overhead"]["basis"] in ("assumed", "measured")
    assert action.gpu_hours_saved > 0 and "the survivors kept running" in action.reason

    # Rank 1's allocation moved to n3; a new standby waits on n4, booked to the job, not a job of its own.
    held = JobAllocation.objects.filter(job=job, released_at__isnull=True).values_list(
        "node__hostname", flat=True
    )
    rows = (
        JobAllocation.objects.filter(job=job)
        .order_by("pk")
        .values_list("node__hostname", "rank_start", "created_at", "released_at")
    )
    assert sorted(held) == ["n1", "n3"], [
        f"{h} r{r} {c:%H:%M:%S.%f} {d and format(d, '%H:%M:%S.%f')}" for h, r, c, d in rows
    ] + [
        f"killed {datetime.fromtimestamp(run['killed_at'], UTC):%H:%M:%S.%f}",
        f"planned {action.planned_at:%H:%M:%S.%f} ended {action.ended_at:%H:%M:%S.%f} node {action.node_id}",
        *[
            f"standby {h} {c:%H:%M:%S.%f} {d and format(d, '%H:%M:%S.%f')}"
            for h, c, d in JobStandby.objects.filter(job=job).values_list(
                "node__hostname", "since", "released_at"
            )
        ],
    ]
    assert "new standby asked for" in action.estimate["standby"]["outcome"], action.estimate["standby"]
    assert Job.objects.filter(cluster=cluster).count() == 1
    standby_jobs = [
        j
        for j in json.loads(slurm.run("squeue", "--json").stdout)["jobs"]
        if str(j.get("comment") or "") == f"lockstep-standby-for={run['slurm_job_id']}"
    ]
    assert len(standby_jobs) == 1 and standby_jobs[0]["nodes"] == "n4", standby_jobs

    _the_job_page_shows_its_way_back(job, action)
    seconds = run["seconds"]
    assert seconds["detect"] < seconds["total"] < 60, seconds
    print(
        f"in-job with Lockstep: node killed → training again {seconds['total']:.1f} s "
        f"(noticed {seconds['notice']:.1f}, Lockstep has it {seconds['detect']:.1f}, decided "
        f"+{seconds['decide']:.1f}, replaced in {seconds['replace']:.1f}); iterations lost "
        f"{replaced['lost_iterations']}; survivors restarted: no"
    )
    slurm.run("scancel", run["slurm_job_id"], str(standby_jobs[0]["job_id"]))


def _the_job_page_shows_its_way_back(job, action) -> None:
    """The job page's "Back to training" table: detect → decide → replace → training again, from what happened
    (the last at the runtime's first step with the standby in place)."""
    import re

    from django.test import Client

    from tests.support.factories import make_user

    browser = Client()
    browser.force_login(make_user("operator"))
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    row = re.search(rf'<tr data-action="{action.pk}"><td>rank_replacement</td>(.*?)</tr>', page, re.S)
    assert row, page[-2000:]
    steps = re.findall(r'data-step="([^"]+)">[^<]*<span class="muted">\+([\d.]+) s', row.group(1))
    assert [name for name, _ in steps] == ["detect", "decide", "replace", "training again"], steps
    seconds = [float(value) for _, value in steps]
    assert seconds == sorted(seconds) and seconds[-1] == pytest.approx(
        (action.resumed_at - min(action.incident.opened_at, action.detected_at)).total_seconds(), abs=0.06
    )
