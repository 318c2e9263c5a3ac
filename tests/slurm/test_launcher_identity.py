"""Jobs prove they are the job (issue 54, H1), on a real Slurm whose root prolog hands each job its secret.

The attack: a launcher credential every tenant's job scripts held registered another tenant's Slurm job
(201, a job token) and a forged ``hang`` report with that token made Lockstep requeue the job. Here the same
requests are refused with nothing written; a job's own script still registers; a new registration revokes the
job's earlier tokens; the audit entry names the credential, the tenant and the job."""

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from controlplane.models import AuditEntry
from fleet.choices import ClusterKind, DriverName
from jobs.choices import JobState
from jobs.launchers import job_secret_of, launcher_credential_create
from jobs.local_slurm.training import AGENT_DIR
from jobs.models import Job, JobToken, RecoveryAction, SlurmJob
from jobs.services.slurm_jobs import slurm_sync
from tests.support.factories import make_cluster, make_fleet
from tests.support.slurm import sbatch, wait


def launcher(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def register(token: str, slurm_id: str, secret: str | None = None):
    body = {"slurm_job_id": slurm_id, **({"job_secret": secret} if secret is not None else {})}
    return launcher(token).post("/api/v1/launchers/register/", body, format="json")


def running(slurm, slurm_id: str) -> dict:
    return wait(
        lambda: next(
            (
                job
                for job in json.loads(slurm.run("squeue", "--json", "--all", "--jobs", slurm_id).stdout)[
                    "jobs"
                ]
                if str(job["job_id"]) == slurm_id and job["job_state"] == "RUNNING"
            ),
            None,
        ),
        what=f"Slurm job {slurm_id} to run",
    )


def written() -> dict:
    """What a registration writes: the rows a refused one must leave as they were."""
    return {
        "jobs": Job.objects.count(),
        "slurm_jobs": SlurmJob.objects.count(),
        "job_tokens": JobToken.objects.count(),
        "live_job_tokens": JobToken.objects.filter(revoked_at__isnull=True).count(),
        "audit": AuditEntry.objects.count(),
    }


@pytest.fixture
def shared(slurm, tenant_a, tenant_b):
    """A cluster two tenants share: Slurm account ``acme`` is tenant A's, ``beta`` tenant B's; its jobs prove
    themselves (the test Slurm's prolog; ``job_secret_key`` in the connection)."""
    cluster = make_cluster(
        make_fleet(),
        driver=DriverName.SLURM,
        kind=ClusterKind.SLURM,
        connection=slurm.connection(
            accounts={"acme": tenant_a.slug, "beta": tenant_b.slug}, gpu_model="H100"
        ),
    )
    slurm_sync(cluster=cluster)
    return cluster


def test_h1_another_tenants_job_is_refused_and_nothing_is_written(slurm, shared, tenant_a, tenant_b):
    victim = sbatch(slurm, "-w", "n1", "-A", "acme", "-J", "victim", "-o", "/dev/null", "--wrap", "sleep 120")
    mine = sbatch(slurm, "-w", "n2", "-A", "beta", "-J", "mine", "-o", "/dev/null", "--wrap", "sleep 120")
    running(slurm, victim), running(slurm, mine)
    victim_secret, my_secret = slurm.job_secret(victim), slurm.job_secret(mine)
    assert victim_secret != my_secret
    _, everyones = launcher_credential_create(actor=None, cluster=shared, name="in every script")
    _, tenant_bs = launcher_credential_create(actor=None, cluster=shared, name="beta's", tenant=tenant_b)
    before = written()

    # 1. The report's exact setup: a cluster-wide credential on a cluster whose jobs do not prove themselves.
    connection = dict(shared.connection)
    shared.connection = {k: v for k, v in connection.items() if k != "job_secret_key"}
    shared.save(update_fields=["connection"])
    answer = register(everyones, victim)
    assert answer.status_code == 403 and "for no tenant" in answer.json()["detail"], answer.content
    shared.connection = connection
    shared.save(update_fields=["connection"])

    # 2. The same credential where jobs prove themselves: another job's secret, none, or a made-up one.
    for secret in (my_secret, None, "", "0" * 64, "é" * 64):
        answer = register(everyones, victim, secret)
        assert answer.status_code == 403, (secret, answer.content)
    # 3. Tenant B's own credential, even with the victim's real secret (stolen): not B's job.
    answer = register(tenant_bs, victim, victim_secret)
    assert answer.status_code == 403 and "one tenant" in answer.json()["detail"], answer.content
    assert written() == before

    # B registers its own job; with that token it may not report a hang for the victim's.
    answer = register(tenant_bs, mine, my_secret)
    assert answer.status_code == 201, answer.content
    my_token = answer.json()["job_token"]
    answer = register(everyones, victim, victim_secret)  # the victim's own script, as it would
    assert answer.status_code == 201, answer.content
    victim_job = Job.objects.get(pk=answer.json()["job"])
    assert victim_job.tenant == tenant_a
    hang = {"kind": "hang", "iteration": 10, "seconds": 120, "stalled_ranks": [0]}
    forged = launcher(my_token).post(f"/api/v1/jobs/{victim_job.pk}/snapshots/", hang, format="json")
    assert forged.status_code == 403, forged.content
    assert Job.objects.get(pk=victim_job.pk).state == JobState.RUNNING
    assert not RecoveryAction.objects.filter(job=victim_job).exists()
    assert running(slurm, victim)["restart_cnt"] == 0


def test_a_new_registration_revokes_the_earlier_tokens_and_is_audited(slurm, shared, tenant_a):
    slurm_id = sbatch(
        slurm, "-w", "n1", "-A", "acme", "-J", "train", "-o", "/dev/null", "--wrap", "sleep 120"
    )
    found = running(slurm, slurm_id)
    secret = slurm.job_secret(slurm_id)
    # The prolog's secret is the one the server derives from what Slurm reports of the run.
    assert secret == job_secret_of(shared.connection["job_secret_key"], found)
    credential, raw = launcher_credential_create(actor=None, cluster=shared, name="acme's", tenant=tenant_a)
    first = register(raw, slurm_id, secret).json()
    job_id = first["job"]
    reporter = launcher(first["job_token"])
    assert (
        reporter.post(f"/api/v1/jobs/{job_id}/progress/", {"iteration": 3}, format="json").status_code == 200
    )
    second = register(raw, slurm_id, secret).json()
    assert second["job"] == job_id
    # The first token is revoked: 401 on a progress report; the new one reports.
    answer = reporter.post(f"/api/v1/jobs/{job_id}/progress/", {"iteration": 4}, format="json")
    assert answer.status_code == 401, answer.content
    answer = launcher(second["job_token"]).post(
        f"/api/v1/jobs/{job_id}/progress/", {"iteration": 4}, format="json"
    )
    assert answer.status_code == 200, answer.content
    assert JobToken.objects.filter(job_id=job_id, revoked_at__isnull=True).count() == 1

    entries = list(AuditEntry.objects.filter(action="launcher.register").order_by("id"))
    assert len(entries) == 2
    entry = entries[-1]
    assert (
        entry.object_type == "jobs.job" and entry.object_id == str(job_id) and entry.tenant_id == tenant_a.pk
    )
    assert entry.actor_name == f"launcher:{credential.prefix}" and entry.token_prefix == credential.prefix
    assert entry.changes == {
        "slurm_job_id": slurm_id,
        "cluster": shared.name,
        "job": job_id,
        "tenant": tenant_a.slug,
        "credential": credential.prefix,
        "credential_id": credential.pk,
        "credential_name": "acme's",
        "credential_tenant": tenant_a.slug,
        "job_secret": "verified",
        "restart_count": 0,
        "job_token": second["job_token"].split("_")[1],
        "job_tokens_revoked": 1,
    }
    # The first registration revoked the token the sync's adoption made, which no one held.
    assert entries[0].changes["job_tokens_revoked"] == 1


# --- the job's own script, inside Slurm, through a real server -------------------------------------------------
ATTEMPTS = """
import json, os, sys
from lockstep_agent.launcher import RegistrationError, register_slurm_job

results = {"had_secret": bool(os.environ.get("LOCKSTEP_JOB_SECRET"))}
for name, slurm_id, secret in json.loads(sys.argv[2]):
    try:
        job, token = register_slurm_job(slurm_job_id=slurm_id or None, secret=secret, wait_seconds=0)
        results[name] = {"job": job, "token": token}
    except RegistrationError as error:
        results[name] = {"error": str(error)}
with open(sys.argv[1] + ".tmp", "w") as out:
    json.dump(results, out)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
"""


@pytest.fixture
def live(tmp_path):
    from tests.support.browser import SERVER_ENV
    from tests.support.processes import uvicorn_server

    with uvicorn_server(tmp_path, **SERVER_ENV) as running_server:
        yield running_server


def script_job(slurm, folder: Path, name: str, account: str, node: str, attempts: list, env: dict) -> str:
    """A job whose script makes ``attempts`` ((name, Slurm job id or None for its own, secret or None for its
    own LOCKSTEP_JOB_SECRET)) and stays running; its results land in ``<folder>/<name>.json``."""
    script = folder / "attempts.py"
    script.write_text(ATTEMPTS)
    return sbatch(
        slurm,
        "-w",
        node,
        "-A",
        account,
        "-J",
        name,
        "-o",
        str(folder / f"{name}.out"),
        "--export",
        ",".join(["ALL", *(f"{k}={v}" for k, v in env.items())]),
        "--wrap",
        f"{sys.executable} {script} {folder / name}.json '{json.dumps(attempts)}'; sleep 120",
    )


def victim_tokens(job) -> list:
    return list(JobToken.objects.filter(job=job).order_by("pk").values_list("pk", "revoked_at"))


def results(folder: Path, name: str) -> dict:
    path = folder / f"{name}.json"
    return json.loads(wait(lambda: path.exists() and path.read_text(), 60, f"{name}'s script"))


@pytest.mark.django_db(transaction=True)
def test_h1_a_jobs_own_script_registers_and_another_jobs_script_cannot_name_it(
    slurm, shared, live, tmp_path, tenant_a, tenant_b
):
    folder = tmp_path / "scripts"
    folder.mkdir()
    _, everyones = launcher_credential_create(actor=None, cluster=shared, name="in every script")
    env = {"LOCKSTEP_URL": live.url, "LOCKSTEP_LAUNCHER_TOKEN": everyones, "PYTHONPATH": str(AGENT_DIR)}
    victim = script_job(slurm, folder, "victim", "acme", "n1", [["own", None, None]], env)
    own = results(folder, "victim")
    assert own["had_secret"] and "job" in own["own"], own
    victim_job = Job.objects.get(pk=own["own"]["job"])
    assert victim_job.tenant == tenant_a and victim_job.slurm.slurm_job_id == victim
    tokens_before = victim_tokens(victim_job)

    # Tenant B's script names the victim's job: with its own secret, with none; then registers its own job.
    attacker = script_job(
        slurm,
        folder,
        "attacker",
        "beta",
        "n2",
        [["with_my_secret", victim, None], ["without_secret", victim, ""], ["own", None, None]],
        env,
    )
    tried = results(folder, "attacker")
    assert (
        "(403)" in tried["with_my_secret"]["error"] and "not the secret" in tried["with_my_secret"]["error"]
    )
    assert "(403)" in tried["without_secret"]["error"] and "prove itself" in tried["without_secret"]["error"]
    attacker_job = Job.objects.get(pk=tried["own"]["job"])
    assert attacker_job.tenant == tenant_b and attacker_job.slurm.slurm_job_id == attacker
    # The refused attempts wrote nothing for the victim's job: its tokens as they were, one registration.
    assert victim_tokens(victim_job) == tokens_before
    assert AuditEntry.objects.filter(action="launcher.register", object_id=str(victim_job.pk)).count() == 1
    assert (
        not AuditEntry.objects.filter(action="launcher.register", tenant_id=tenant_b.pk)
        .exclude(object_id=str(attacker_job.pk))
        .exists()
    )
    # The victim's token still reports: nothing revoked it.
    answer = launcher(own["own"]["token"]).post(
        f"/api/v1/jobs/{victim_job.pk}/progress/", {"iteration": 1}, format="json"
    )
    assert answer.status_code == 200, answer.content


# --- the node side, without Slurm ----------------------------------------------------------------------------
def prolog_env(tmp_path: Path, **extra) -> dict:
    return {
        "SLURM_JOB_ID": "42",
        "SLURM_CLUSTER_NAME": "lockstep",
        "SLURM_JOB_RESTART_COUNT": "2",
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_GID": str(os.getgid()),
        "SLURM_JOB_ACCOUNT": "acme",
        "SLURMD_NODENAME": "n1",
        **extra,
    }


def test_the_prolog_and_the_server_derive_the_same_secret_and_the_key_stays_roots(tmp_path):
    from lockstep_agent import launcher as node

    key = tmp_path / "job-secret.key"
    key.write_text("k" * 64 + "\n")
    key.chmod(0o600)
    secrets_dir = str(tmp_path / "secrets" / "{node}")
    env = prolog_env(tmp_path)
    path = Path(node.prolog(key_file=str(key), secret_dir=secrets_dir, env=env))
    assert path == tmp_path / "secrets" / "n1" / "42"
    assert stat.S_IMODE(path.stat().st_mode) == 0o400 and stat.S_IMODE(path.parent.stat().st_mode) == 0o711
    slurm_says = {
        "cluster": "lockstep",
        "job_id": 42,
        "restart_cnt": 2,
        "user_id": os.getuid(),
        "account": "acme",
    }
    assert path.read_text() == job_secret_of("k" * 64, slurm_says)
    assert (
        node.task_prolog(secret_dir=secrets_dir, env=env) == f"export LOCKSTEP_JOB_SECRET={path.read_text()}"
    )
    # Another user, account or job: another secret. Another run of the job (a requeue): the same, since Slurm
    # skips the prolog of a run it relaunches on a node within its credential lifetime.
    for change in ({"user_id": 1000}, {"account": "beta"}, {"job_id": 43}, {"cluster": "other"}):
        assert job_secret_of("k" * 64, {**slurm_says, **change}) != path.read_text()
    assert job_secret_of("k" * 64, {**slurm_says, "restart_cnt": 3}) == path.read_text()
    secret = path.read_text()
    # The epilog sets it aside: a relaunch on this node whose prolog Slurm skips still gets it; after
    # --keep-seconds the next epilog on the node removes it.
    node.epilog(secret_dir=secrets_dir, env=env)
    ended = path.with_name("42.ended")
    assert not path.exists() and ended.read_text() == secret
    assert node.task_prolog(secret_dir=secrets_dir, env=env) == f"export LOCKSTEP_JOB_SECRET={secret}"
    node.epilog(secret_dir=secrets_dir, env={**env, "SLURM_JOB_ID": "7"}, keep_seconds=3600)
    assert ended.exists()
    os.utime(ended, (0, 0))
    node.epilog(secret_dir=secrets_dir, env={**env, "SLURM_JOB_ID": "7"}, keep_seconds=3600)
    assert not ended.exists() and node.task_prolog(secret_dir=secrets_dir, env=env) == ""
    # A key others may read, or a short one, is refused: the prolog writes nothing (and exits 0: a failing
    # prolog would drain the node).
    key.chmod(0o644)
    with pytest.raises(PermissionError):
        node.prolog(key_file=str(key), secret_dir=secrets_dir, env=env)
    key.write_text("short")
    key.chmod(0o600)
    with pytest.raises(ValueError):
        node.prolog(key_file=str(key), secret_dir=secrets_dir, env=env)
    with pytest.raises(ValueError):
        node.prolog(key_file=str(key), secret_dir=secrets_dir, env={**env, "SLURM_JOB_ID": "../x"})
    assert not path.exists()
