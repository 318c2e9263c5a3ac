"""The real node agent (as a process, NVML replaced by the fake module at its import boundary: there is no GPU
here) sending to a live uvicorn: what it reads lands as state, and an Xid becomes a FaultEvent."""

import pytest

from jobs.models import FaultEvent
from telemetry.models import GPUState, IngestBatch
from telemetry.services.tokens import agent_token_create
from tests.support.agent import run_agent
from tests.support.factories import make_cluster, make_node
from tests.support.processes import uvicorn_server

pytestmark = pytest.mark.django_db(transaction=True)


def test_agent_batch_reaches_the_control_plane(tmp_path):
    node = make_node(make_cluster(), "dgx-e2e", gpus=2, nics=2)
    _, token = agent_token_create(actor=None, cluster=node.cluster, name="e2e")
    (tmp_path / "sys").mkdir()
    with uvicorn_server(tmp_path) as server:
        done = run_agent(
            "--url",
            server.url,
            "--token",
            token,
            "--node",
            "dgx-e2e",
            "--once",
            "--spool-dir",
            str(tmp_path / "spool"),
            "--sysfs-root",
            str(tmp_path / "sys"),
            fake_nvml={"xids": [[1, 79]]},
        )
        assert done.returncode == 0, done.stderr
    assert IngestBatch.objects.filter(cluster=node.cluster).count() == 1
    states = GPUState.objects.filter(node=node).order_by("gpu__index")
    assert [s.gpu.index for s in states] == [0, 1] and all(s.temperature is not None for s in states)
    fault = FaultEvent.objects.get(node=node)
    assert (fault.kind, fault.xid, fault.gpu_index, fault.sources) == ("gpu_xid", 79, 1, ["agent"])


def test_agent_for_another_cluster_is_refused_and_spools(tmp_path):
    node = make_node(make_cluster(), "dgx-mine", gpus=2, nics=0)
    _, other_token = agent_token_create(actor=None, cluster=make_cluster(), name="other")
    (tmp_path / "sys").mkdir()
    with uvicorn_server(tmp_path) as server:
        done = run_agent(
            "--url",
            server.url,
            "--token",
            other_token,
            "--node",
            node.hostname,
            "--once",
            "--spool-dir",
            str(tmp_path / "spool"),
            "--sysfs-root",
            str(tmp_path / "sys"),
            fake_nvml={},
        )
    assert not IngestBatch.objects.exists()
    assert "400" in done.stderr or "unknown node" in done.stderr
