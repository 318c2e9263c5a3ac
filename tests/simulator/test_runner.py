"""The simulator speaking to a live control plane over HTTP, as a real fleet does."""

import pytest

from jobs.models import FaultEvent
from simulator.runner import Pending, Runner
from simulator.sampling import Strike
from simulator.world import world_build
from telemetry.models import FacilityState, GPUState
from tests.support.processes import uvicorn_server

pytestmark = pytest.mark.django_db(transaction=True)


def strike(kind, channel="agent", xid=None, component="test"):
    return Strike(at_hours=0.0, component=component, kind=kind, xid=xid, precursor="", channel=channel, gpu=0)


def test_telemetry_flows_and_faults_arrive_through_the_public_api(tmp_path):
    world_build(seed=1, nodes_per_cluster=8, spares=2)
    with uvicorn_server(tmp_path) as server:
        runner = Runner(url=server.url, acceleration=0.0, tick_seconds=0)
        runner.tick()
        assert runner.stats.batches_sent == 4 and runner.stats.batches_failed == 0
        assert GPUState.objects.count() == runner.gpu_count == 4 * 10 * 8
        assert FacilityState.objects.filter(scope="rack").exists()
        victim, dead = runner.nodes[0], runner.nodes[1]
        runner.pending += [
            Pending(strike("gpu_xid", xid=79), victim, 3, 0.0),
            Pending(strike("node_unreachable", channel="alertmanager"), dead, 0, 0.0),
        ]
        runner.tick()
    xid = FaultEvent.objects.get(kind="gpu_xid")
    assert (xid.node.hostname, xid.gpu_index, xid.xid, xid.sources) == (victim.hostname, 3, 79, ["agent"])
    down = FaultEvent.objects.get(kind="node_unreachable")
    assert down.node.hostname == dead.hostname and down.sources == ["alertmanager"]


def test_simulator_keeps_going_when_the_control_plane_restarts(tmp_path):
    world_build(seed=2, nodes_per_cluster=4, spares=1)
    with uvicorn_server(tmp_path) as server:
        runner = Runner(url=server.url, acceleration=0.0, tick_seconds=0)
        runner.tick()
        url = server.url
    runner.pending.append(Pending(strike("gpu_xid", xid=48), runner.nodes[0], 1, 0.0))
    runner.tick()  # the control plane is down: nothing is lost, the Xid waits
    assert runner.stats.batches_failed == 4
    with uvicorn_server(tmp_path) as server:
        runner.url = server.url
        runner.tick()
        assert runner.stats.batches_sent == 8
    assert url and FaultEvent.objects.filter(kind="gpu_xid", xid=48).count() == 1


def test_grey_failure_is_seen_as_a_degraded_link_without_a_link_down(tmp_path):
    world_build(seed=4, nodes_per_cluster=4, spares=1)
    with uvicorn_server(tmp_path) as server:
        runner = Runner(url=server.url, acceleration=0.0, tick_seconds=0)
        runner.tick()
        node = runner.nodes[2]
        runner.start_grey("errors", node, index=5)
        for _ in range(3):
            runner.tick()
    fault = FaultEvent.objects.get(kind="link_degraded")
    assert (fault.node.hostname, fault.nic_name) == (node.hostname, "mlx5_5")
    assert not FaultEvent.objects.filter(kind="nic_down").exists()


def test_jobs_report_their_own_progress_and_slow_down_on_a_grey_link(tmp_path):
    from jobs.models import Job

    world_build(seed=5, nodes_per_cluster=6, spares=1)
    with uvicorn_server(tmp_path) as server:
        runner = Runner(url=server.url, acceleration=0.0, tick_seconds=0)
        runner.tick()
        job = Job.objects.filter(cluster__name="use-h100-a", state="Running").first()
        assert job is not None and job.simulated and job.reports_progress  # reports, stays simulated
        mine = runner.jobs[job.pk]
        host = job.allocations.filter(released_at__isnull=True).first().node.hostname
        node = next(n for n in runner.nodes if n.hostname == host)
        runner.start_grey("errors", node, index=1)
        mine["at"] -= 100 * mine["base"]  # 100 steps' worth of time passes
        before = mine["iteration"]
        runner.drive_jobs(mine["at"] + 100 * mine["base"])
    assert 70 < mine["iteration"] - before < 80  # 30 % slower: about 77 iterations instead of 100
    job.refresh_from_db()
    assert job.iteration == int(mine["iteration"])
    assert job.seconds_per_iteration > mine["base"]


def test_a_job_does_not_train_while_lockstep_recovers_it(tmp_path):
    from jobs.models import Job

    world_build(seed=5, nodes_per_cluster=6, spares=1)
    with uvicorn_server(tmp_path) as server:
        runner = Runner(url=server.url, acceleration=0.0, tick_seconds=0)
        runner.tick()
        job = Job.objects.filter(cluster__name="use-h100-a", state="Running").first()
        base, start = runner.jobs[job.pk]["base"], runner.jobs[job.pk]["at"]
        Job.objects.filter(pk=job.pk).update(state="Recovering", iteration=40)
        runner.drive_jobs(start + 500 * base)  # 500 steps' worth of time, stopped: nothing reported
        job.refresh_from_db()
        assert job.iteration == 40
        Job.objects.filter(pk=job.pk).update(state="Running", iteration=30)  # restored to 30
        runner.drive_jobs(start + 600 * base)  # running again, from 30
        runner.drive_jobs(start + 610 * base)  # ten steps later
    job.refresh_from_db()
    assert 39 <= job.iteration <= 41


def test_each_grey_failure_of_the_simulated_fabric_gets_its_diagnosis(tmp_path):
    """The simulator's fabric cases through ingest: a port with rising errors, a congested rail, a slow GPU."""
    from jobs.models import Job
    from telemetry.diagnosis import diagnose

    world_build(seed=6, nodes_per_cluster=16, spares=2)
    job = Job.objects.filter(cluster__name="use-h100-a", gpus__gte=32, state="Running").first()
    hosts = list(
        job.allocations.filter(released_at__isnull=True)
        .order_by("rank_start")
        .values_list("node__hostname", flat=True)
    )
    with uvicorn_server(tmp_path) as server:
        runner = Runner(url=server.url, acceleration=0.0, tick_seconds=0)
        by_host = {n.hostname: n for n in runner.nodes}
        verdicts = {}
        for case, host, index in [
            ("errors", hosts[1], 3),
            ("congestion", hosts[0], 6),
            ("slow_gpu", hosts[2], 4),
        ]:
            for _ in range(2):
                runner.tick()
            runner.start_grey(case, by_host[host], index=index)
            for _ in range(4):
                runner.tick()
            verdicts[case] = diagnose(job)
            runner.grey[-1] = (runner.grey[-1][0], runner.grey[-1][1], 0.0)  # end it
            runner._grey_failures(1.0)
            from telemetry.models import GPUState, NICState

            NICState.objects.update(symbol_rate=0.0, congestion_rate=0.0)
            GPUState.objects.update(throttle_share=0.0)
    assert verdicts["errors"]["fabric"] and verdicts["errors"]["culprit"].startswith(f"{hosts[1]}/mlx5_3")
    assert verdicts["congestion"]["fabric"] and verdicts["congestion"]["where"] in ("rail", "leaf")
    assert not verdicts["slow_gpu"]["fabric"] and verdicts["slow_gpu"]["culprit"] == f"{hosts[2]}/gpu4"


def test_a_dead_node_is_repaired_comes_back_and_returns_as_a_spare_that_reports(tmp_path, settings):
    """The simulated technician repairs a dead node whose ladder waits for a repair, through the API; the node
    reports again, so its health check and clean-telemetry window see fresh evidence."""
    from datetime import timedelta

    from django.utils import timezone

    from fleet.choices import NodeState
    from fleet.models import Cluster, Node
    from jobs.choices import EscalationStage
    from jobs.models import NodeEscalation
    from jobs.services.advance import recovery_advance
    from jobs.services.faults import fault_handle

    settings.ESCALATION_CLEAN_TELEMETRY_SECONDS = 1
    world_build(seed=3, nodes_per_cluster=4, spares=1)
    for cluster in Cluster.objects.all():
        cluster.connection = {**cluster.connection, "health_check_seconds": 0, "migration_pause_seconds": 0}
        cluster.save(update_fields=["connection"])
    with uvicorn_server(tmp_path) as server:
        runner = Runner(url=server.url, acceleration=0.0, tick_seconds=0)
        runner.tick()  # every node's agent has reported
        idle = (
            Node.objects.filter(state=NodeState.SPARE).order_by("pk").first()
        )  # no job to move off it first
        dead = next(n for n in runner.nodes if n.id == idle.pk)
        runner.pending.append(Pending(strike("node_unreachable", channel="alertmanager"), dead, 0, 0.0))
        runner.tick()
        assert dead.dead
        fault = FaultEvent.objects.get(kind="node_unreachable", node_id=dead.id)
        fault_handle(fault_id=fault.pk)
        for _ in range(4):
            recovery_advance()
        assert NodeEscalation.objects.get(node_id=dead.id).stage == EscalationStage.FAILED
        seen_while_dead = Node.objects.get(pk=dead.id).last_seen_at
        runner.tick()
        assert Node.objects.get(pk=dead.id).last_seen_at == seen_while_dead  # a dead node is silent
        runner.acceleration = 3600.0  # a simulated hour per real second: the repair takes 4 s
        assert runner.repair_dead(1000.0) == 0 and dead.repair_due == pytest.approx(1004.0)
        runner.repair_dead(1005.0)  # the technician posts the repair
        assert NodeEscalation.objects.get(node_id=dead.id).stage == EscalationStage.REPAIRED
        runner.acceleration = 0.0
        assert runner.repair_dead(1006.0) == 1 and not dead.dead
        recovery_advance()  # the health check passes; the clean window starts
        escalation = NodeEscalation.objects.get(node_id=dead.id)
        assert escalation.stage == EscalationStage.VALIDATED and escalation.has_agent
        NodeEscalation.objects.filter(pk=escalation.pk).update(
            check_passed_at=timezone.now() - timedelta(seconds=2)
        )
        runner.tick()  # the revived node reports again
        assert Node.objects.get(pk=dead.id).last_seen_at > seen_while_dead
        recovery_advance()
    escalation = NodeEscalation.objects.get(node_id=dead.id)
    assert escalation.stage == EscalationStage.RETURNED
    assert Node.objects.get(pk=dead.id).state == NodeState.SPARE
    assert [e["step"] for e in escalation.evidence][-2:] == ["telemetry", "returned"]
