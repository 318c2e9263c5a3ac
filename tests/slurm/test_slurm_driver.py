"""The Slurm driver and the Slurm sync against a real Slurm (munged, slurmctld, three slurmd): no fakes."""

import json

import pytest
from rest_framework.test import APIClient

from fleet.choices import ClusterKind, DriverName, NodeState
from fleet.drivers import Operation, driver_for
from fleet.models import Node
from jobs.choices import JobState
from jobs.launchers import launcher_credential_create
from jobs.models import Job, SlurmJob
from jobs.services.slurm_jobs import slurm_sync
from tests.support.factories import make_cluster, make_fleet, make_user, token_header
from tests.support.slurm import sbatch, wait


def sinfo(slurm, hostname: str) -> dict:
    return next(n for n in json.loads(slurm.run("sinfo", "--json").stdout)["nodes"] if n["name"] == hostname)


def operator_client() -> APIClient:
    client = APIClient()
    client.credentials(**token_header(make_user("operator")))
    return client


def test_slurm_nodes_appear_with_their_gpus_partitions_and_node_software(slurm_cluster):
    nodes = {
        node.hostname: node for node in Node.objects.filter(cluster=slurm_cluster).prefetch_related("gpus")
    }
    assert sorted(nodes) == ["n1", "n2", "n3"]
    assert [node.gpus.count() for node in nodes.values()] == [2, 2, 2]
    # n3 is in the spare partition and idle: one of Lockstep's spares; the others are ready.
    assert nodes["n3"].state == NodeState.SPARE and nodes["n1"].state == nodes["n2"].state == NodeState.READY
    observed = {state.name: state.version for state in driver_for(slurm_cluster).observe_addons()}
    assert observed == {"node-software.gpu_driver": "550"}
    driver = driver_for(slurm_cluster)
    assert (
        Operation.RESTART_FROM_CHECKPOINT in driver.supports
        and Operation.MIGRATE_WORKER not in driver.supports
    )
    assert slurm_sync(cluster=slurm_cluster)["added"] == []  # a second look adds nothing


def test_slurm_cordon_and_uncordon_through_the_api_show_in_sinfo(slurm, slurm_cluster):
    node = Node.objects.get(cluster=slurm_cluster, hostname="n1")
    client = operator_client()
    answer = client.post(f"/api/v1/nodes/{node.pk}/cordon/", {"reason": "bad DIMM"}, format="json")
    assert answer.status_code == 200, answer.content
    seen = sinfo(slurm, "n1")
    assert "DRAIN" in seen["state_flags"] and seen["reason"].startswith("lockstep:")
    assert Node.objects.get(pk=node.pk).state == NodeState.CORDONED
    answer = client.post(f"/api/v1/nodes/{node.pk}/uncordon/", {}, format="json")
    assert answer.status_code == 200, answer.content
    seen = sinfo(slurm, "n1")
    assert "DRAIN" not in seen["state_flags"] and seen["state"] == "idle"


def test_slurm_drain_shows_draining_until_the_running_job_ends(slurm, slurm_cluster):
    slurm_id = sbatch(slurm, "-w", "n1", "-A", "other", "-o", "/dev/null", "--wrap", "sleep 60")
    wait(lambda: sinfo(slurm, "n1")["state"] in ("mixed", "allocated"), what="the job to start on n1")
    node = Node.objects.get(cluster=slurm_cluster, hostname="n1")
    driver = driver_for(slurm_cluster)
    handle = driver.drain(node).handle
    assert not driver.drain_done(node) and driver.operation_status(handle) == "running"
    assert "DRAIN" in sinfo(slurm, "n1")["state_flags"]
    slurm.run("scancel", slurm_id)
    wait(lambda: driver.drain_done(node), what="Slurm to report n1 drained")
    assert driver.operation_status(handle) == "succeeded"


def test_slurm_job_submitted_with_sbatch_appears_with_its_nodes_and_tenant(slurm, slurm_cluster, tenant_a):
    mapped = sbatch(slurm, "-N", "2", "-A", "acme", "-J", "pretrain", "-o", "/dev/null", "--wrap", "sleep 60")
    unmapped = sbatch(slurm, "-w", "n3", "-A", "nobody", "-o", "/dev/null", "--wrap", "sleep 60")
    wait(
        lambda: (
            len(
                [
                    j
                    for j in json.loads(slurm.run("squeue", "--json").stdout)["jobs"]
                    if j["job_state"] == "RUNNING"
                ]
            )
            == 2
        ),
        what="both jobs running",
    )
    result = slurm_sync(cluster=slurm_cluster)
    assert result["adopted"] == [mapped]
    assert [entry["slurm_job_id"] for entry in result["unmapped"]] == [unmapped]
    # The unmapped job is listed to the provider (no Lockstep job, and why); tenant A sees only its own.
    listed = operator_client().get("/api/v1/slurm-jobs/", {"unmapped": "true"}).json()["results"]
    assert [(row["slurm_job_id"], row["job"], row["account"]) for row in listed] == [
        (unmapped, None, "nobody")
    ]
    assert "nobody" in listed[0]["unmapped"] and listed[0]["nodes"] == "n3"
    tenant_user = APIClient()
    tenant_user.credentials(**token_header(make_user("tenant-admin", tenant=tenant_a)))
    seen = tenant_user.get("/api/v1/slurm-jobs/").json()["results"]
    assert [row["slurm_job_id"] for row in seen] == [mapped]
    assert tenant_user.get(f"/api/v1/slurm-jobs/{listed[0]['id']}/").status_code == 404
    link = SlurmJob.objects.select_related("job").get(cluster=slurm_cluster, slurm_job_id=mapped)
    job = link.job
    assert job.tenant == tenant_a and job.state == JobState.RUNNING and not job.simulated
    assert job.name == f"pretrain-{mapped}" and job.gpus == 4
    assert sorted(job.allocations.values_list("node__hostname", flat=True)) == ["n1", "n2"]
    slurm.run("scancel", mapped)
    wait(
        lambda: (
            slurm_sync(cluster=slurm_cluster)["ended"].get(mapped) == JobState.CANCELLED
            or Job.objects.get(pk=job.pk).state == JobState.CANCELLED
        ),
        what="the cancel to reach Lockstep",
    )
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    assert not job.allocations.filter(released_at__isnull=True).exists()
    # Once its account maps to a tenant, the next look adopts the job it listed.
    slurm_cluster.connection = {
        **slurm_cluster.connection,
        "accounts": {"acme": tenant_a.slug, "nobody": tenant_a.slug},
    }
    slurm_cluster.save(update_fields=["connection"])
    assert slurm_sync(cluster=slurm_cluster)["adopted"] == [unmapped]
    assert SlurmJob.objects.get(cluster=slurm_cluster, slurm_job_id=unmapped).job.tenant == tenant_a
    assert not operator_client().get("/api/v1/slurm-jobs/", {"unmapped": "true"}).json()["results"]


def test_slurm_launcher_credential_registers_only_jobs_of_its_own_cluster(slurm, slurm_cluster, tenant_a):
    other = make_cluster(
        make_fleet(),
        driver=DriverName.SLURM,
        kind=ClusterKind.SLURM,
        connection={"slurm_conf": "/nonexistent/slurm.conf"},
    )
    _, mine = launcher_credential_create(actor=None, cluster=slurm_cluster, name="sbatch")
    _, theirs = launcher_credential_create(actor=None, cluster=other, name="sbatch", tenant=tenant_a)
    slurm_id = sbatch(slurm, "-N", "1", "-A", "acme", "-o", "/dev/null", "--wrap", "sleep 60")
    wait(
        lambda: (
            json.loads(slurm.run("squeue", "--json", "--jobs", slurm_id).stdout)["jobs"][0]["job_state"]
            == "RUNNING"
        ),
        what="the job to run",
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {theirs}")
    answer = client.post(
        "/api/v1/launchers/register/", {"slurm_job_id": slurm_id, "cluster": slurm_cluster.pk}, format="json"
    )
    assert answer.status_code == 403, answer.content
    answer = client.post("/api/v1/launchers/register/", {"slurm_job_id": slurm_id}, format="json")
    assert answer.status_code in (404, 503), answer.content  # its own Slurm does not run that job
    assert not SlurmJob.objects.exists()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {mine}")
    assert (
        client.post("/api/v1/launchers/register/", {"slurm_job_id": "x1"}, format="json").status_code == 400
    )
    assert (
        client.post("/api/v1/launchers/register/", {"slurm_job_id": "99999"}, format="json").status_code
        == 404
    )
    secret = slurm.job_secret(slurm_id)  # what the job's prolog gave it (LOCKSTEP_JOB_SECRET)
    answer = client.post(
        "/api/v1/launchers/register/", {"slurm_job_id": slurm_id, "job_secret": secret}, format="json"
    )
    assert answer.status_code == 201, answer.content
    body = answer.json()
    job = Job.objects.get(pk=body["job"])
    assert job.cluster == slurm_cluster and job.tenant == tenant_a and body["job_token"].startswith("lsj_")
    from controlplane.models import AuditEntry

    assert AuditEntry.objects.filter(action="launcher.register", object_id=str(job.pk)).exists()
    # The job token reports progress for that job only; the launcher credential itself may not.
    progress = APIClient()
    progress.credentials(HTTP_AUTHORIZATION=f"Bearer {body['job_token']}")
    assert (
        progress.post(f"/api/v1/jobs/{job.pk}/progress/", {"iteration": 5}, format="json").status_code == 200
    )
    assert client.post(f"/api/v1/jobs/{job.pk}/progress/", {"iteration": 6}, format="json").status_code in (
        401,
        403,
    )
    # Registering again (a requeued run) gives a new token for the same job; the earlier one stops working.
    again = client.post(
        "/api/v1/launchers/register/", {"slurm_job_id": slurm_id, "job_secret": secret}, format="json"
    ).json()
    assert again["job"] == job.pk and again["job_token"] != body["job_token"]
    assert (
        progress.post(f"/api/v1/jobs/{job.pk}/progress/", {"iteration": 7}, format="json").status_code == 401
    )
    client.credentials(HTTP_AUTHORIZATION="Bearer lsl_notreal")
    assert (
        client.post("/api/v1/launchers/register/", {"slurm_job_id": slurm_id}, format="json").status_code
        == 401
    )


@pytest.mark.parametrize("passes", [True, False], ids=["passing", "failing"])
def test_slurm_health_check_is_a_job_pinned_to_the_node_and_a_failing_one_keeps_it_out(
    slurm, slurm_cluster, passes
):
    node = Node.objects.get(cluster=slurm_cluster, hostname="n2")
    if not passes:
        # The check exercises the node; here the node's check fails (as a broken GPU's matrix multiply would).
        slurm_cluster.connection = {
            **slurm_cluster.connection,
            "health_check_command": 'test "$SLURMD_NODENAME" != n2',
        }
        slurm_cluster.save(update_fields=["connection"])
    driver = driver_for(slurm_cluster)
    driver.cordon(node)
    assert "DRAIN" in sinfo(slurm, "n2")["state_flags"]
    handle = driver.health_check(node).handle
    slurm_id = handle.split(":")[1]
    status = wait(
        lambda: (lambda s: s if s != "running" else None)(driver.operation_status(handle)),
        60,
        "the check job to end",
    )
    assert status == ("succeeded" if passes else "failed")
    seen = sinfo(slurm, "n2")
    # Either way the node is drained again: only Lockstep's return to service (an uncordon) resumes it.
    assert "DRAIN" in seen["state_flags"] and seen["reason"].startswith("lockstep: health check")
    check = json.loads(slurm.run("squeue", "--json", "--all", "--jobs", slurm_id).stdout)["jobs"][0]
    assert check["nodes"] == "n2" and check["job_state"] == ("COMPLETED" if passes else "FAILED")
    assert "lockstep-check-n2" not in slurm.run("scontrol", "show", "reservation").stdout
