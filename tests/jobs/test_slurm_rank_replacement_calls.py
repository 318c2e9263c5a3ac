"""The Slurm driver's part of a rank replacement, against stand-ins for Slurm's tools that record how they were called
(the real Slurm: tests/slurm/test_in_job_recovery.py): the lost node drained with its incident's reason and the job
left running (no requeue), and a new standby submitted as a one-node job of the job's account on the spare
partition that names the job it stands by."""

import json

import pytest

from fleet.choices import DriverName
from fleet.drivers.slurm import SlurmDriver
from fleet.models import Node
from jobs.models import Job, SlurmJob
from tests.support.factories import make_cluster, make_fleet

pytestmark = pytest.mark.django_db

JOB = {
    "job_id": 41,
    "job_state": "RUNNING",
    "account": "acme",
    "command": "/srv/train_slurm.sh --standbys 1",
    "current_working_directory": "/srv/run",
    "standard_output": "/srv/run/out/job-41.out",
}


@pytest.fixture
def calls(monkeypatch):
    """Slurm's tools stood in for (no process): each call recorded, squeue answering with JOB."""
    made = []

    def run(self, *args):
        made.append(list(args))
        return {"squeue": json.dumps({"jobs": [JOB]}), "sbatch": "77;cluster"}.get(args[0], "")

    monkeypatch.setattr(SlurmDriver, "_run", run)
    return made


def test_replace_rank_drains_without_requeue_and_a_standby_is_submitted(calls, tenant_a):
    cluster = make_cluster(make_fleet(), driver=DriverName.SLURM, connection={"spare_partition": "spare"})
    node = Node.objects.create(cluster=cluster, hostname="n2", gpu_model="gpu")
    job = Job.objects.create(tenant=tenant_a, cluster=cluster, name="train", gpus=2, simulated=False)
    SlurmJob.objects.create(job=job, cluster=cluster, slurm_job_id="41", account="acme")
    driver = SlurmDriver(cluster)

    result = driver.replace_rank(job.ref, node)
    assert result.handle == "replace:41:n2" and driver.operation_status(result.handle) == "running"
    assert calls == [["scontrol", "update", "NodeName=n2", "State=DRAIN", calls[0][4]]]
    assert calls[0][4].startswith("Reason=lockstep: ")
    assert not any("requeue" in " ".join(call) for call in calls)

    standby = driver.replenish_standby(job.ref)
    assert standby.handle == "standby:77:41"
    assert [call[0] for call in calls[1:]] == ["squeue", "sbatch"]
    assert calls[-1] == [
        "sbatch",
        "--parsable",
        "-p",
        "spare",
        "-N",
        "1",
        "--ntasks-per-node=1",
        "-A",
        "acme",
        "--chdir",
        "/srv/run",
        "-o",
        "/srv/run/out/standby-%j.out",
        "--comment=lockstep-standby-for=41",
        "-J",
        "standby-41",
        "/srv/train_slurm.sh",
        "--standbys",
        "1",
        "--standby-for",
        "41",
    ]
