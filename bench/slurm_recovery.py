"""Benchmark (not a timed test): a node dies under a real PyTorch job on a real Slurm, with and without Lockstep.

Each run starts a fresh Slurm (munged, slurmctld, three slurmd: jobs/local_slurm/cluster.py) and runs the
training job (agent/lockstep_agent/examples/train_slurm.py, two nodes, gloo, a checkpoint every 20 steps) until
it has trained past its second checkpoint; then node n2 dies (its slurmd, step daemon and rank are killed).

- With Lockstep (a real uvicorn server the job registers with and reports to; beat's steps in a loop every
  0.25 s): the time from the kill to the job's first training step after the restart, split into detection
  (Slurm's ping of n2 fails and the sync stores the fault), Lockstep's decision (the fault is handled and the
  requeue is started), Slurm's drain and requeue (until Slurm runs the job again without n2, on the spare), and
  the job's own restart (Python, torch, gloo rendezvous, registration, checkpoint load, one step).
- In-job (issue 49; the job with a standby in its allocation, under the protection runtime, on a cluster whose
  policy turns it on; four nodes, n4 in the spare partition): the runtime notices the broken collective, Lockstep
  gets its report, decides rank_replacement and drains n2, the standby takes rank 1 restored from its peer's
  memory while the survivor keeps its process, and Lockstep starts a new standby on n4
  (tests/support/slurm_scenario.py ``in_job_with_lockstep``).
- Without Lockstep (Slurm alone, the same job and partition, ``--requeue``, JobRequeue=1): when Slurm marks the
  node down (SlurmdTimeout), whether it requeues the job or loses it, and when the job trains again.

Run: .venv/bin/python bench/slurm_recovery.py [--runs 5] [--slurmd-timeout 10] [--cred-expire 120]
Needs slurm-wlm, munge, root and torch; a PostgreSQL at BENCH_ADMIN_DATABASE_URL (scratch database
lockstep_bench_slurm) and Redis at BENCH_REDIS_URL.
"""

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DB_NAME = "lockstep_bench_slurm"
ADMIN_URL = os.environ.get("BENCH_ADMIN_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
DB_URL = ADMIN_URL.rsplit("/", 1)[0] + f"/{DB_NAME}"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")


def setup_django() -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')
    os.environ.update(
        DATABASE_URL=DB_URL,
        REDIS_URL=REDIS_URL,
        DJANGO_SETTINGS_MODULE="controlplane.testing.settings",
        LOG_LEVEL="WARNING",
    )
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "agent"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def one_run(index: int, slurmd_timeout: int, cred_expire: int) -> tuple[dict, dict]:
    from fleet.choices import ClusterKind, DriverName
    from fleet.models import Cluster, Fleet
    from jobs.launchers import launcher_credential_create
    from jobs.local_slurm.cluster import SlurmCluster
    from jobs.services.slurm_jobs import slurm_sync
    from tenancy.models import Tenant
    from tests.support.processes import uvicorn_server
    from tests.support.slurm_scenario import with_lockstep, without_lockstep

    folder = Path(tempfile.mkdtemp(prefix="lockstep-bench-slurm-"))
    tenant = Tenant.objects.create(name=f"Bench {index}", slug=f"bench-{index}")
    with (
        SlurmCluster(folder / "with", slurmd_timeout=slurmd_timeout, cred_expire=cred_expire) as slurm,
        uvicorn_server(folder) as server,
    ):
        fleet = Fleet.objects.create(name=f"bench-slurm-{index}")
        cluster = Cluster.objects.create(
            fleet=fleet,
            name=f"bench-slurm-{index}",
            driver=DriverName.SLURM,
            kind=ClusterKind.SLURM,
            connection=slurm.connection(accounts={"acme": tenant.slug}, gpu_model="H100"),
        )
        slurm_sync(cluster=cluster)
        _, token = launcher_credential_create(actor=None, cluster=cluster, name="bench")
        lockstep = with_lockstep(slurm, cluster, folder / "run-with", launcher_token=token, url=server.url)
    with SlurmCluster(folder / "without", slurmd_timeout=slurmd_timeout, cred_expire=cred_expire) as slurm:
        alone = without_lockstep(slurm, folder / "run-without")
    return lockstep, alone


def in_job_run(index: int, slurmd_timeout: int, cred_expire: int) -> dict:
    """The in-job mode: a cluster whose policy turns the protection runtime on, the job with one standby."""
    from fleet.choices import ClusterKind, DriverName
    from fleet.models import BlueprintVersion, Cluster, Fleet
    from jobs.launchers import launcher_credential_create
    from jobs.local_slurm.cluster import SlurmCluster
    from jobs.services.slurm_jobs import slurm_sync
    from tenancy.models import Tenant
    from tests.support.factories import make_blueprint
    from tests.support.processes import uvicorn_server
    from tests.support.slurm_scenario import in_job_with_lockstep

    folder = Path(tempfile.mkdtemp(prefix="lockstep-bench-in-job-"))
    tenant = Tenant.objects.create(name=f"Bench in-job {index}", slug=f"bench-in-job-{index}")
    _, version = make_blueprint()
    BlueprintVersion.objects.filter(pk=version.pk).update(policy={"protection": {"runtime": True}})
    sizes = {"nodes": 4, "spare_nodes": 1, "holders": True}
    with (
        SlurmCluster(
            folder / "slurm", slurmd_timeout=slurmd_timeout, cred_expire=cred_expire, **sizes
        ) as slurm,
        uvicorn_server(folder) as server,
    ):
        cluster = Cluster.objects.create(
            fleet=Fleet.objects.create(name=f"bench-in-job-{index}"),
            name=f"bench-in-job-{index}",
            driver=DriverName.SLURM,
            kind=ClusterKind.SLURM,
            blueprint_version=version,
            connection=slurm.connection(accounts={"acme": tenant.slug}, gpu_model="H100"),
        )
        slurm_sync(cluster=cluster)
        _, token = launcher_credential_create(actor=None, cluster=cluster, name="bench")
        run = in_job_with_lockstep(slurm, cluster, folder / "run", launcher_token=token, url=server.url)
        slurm.run("scancel", "--user", "root", check=False)
    return run


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f} ({min(values):.1f}–{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--slurmd-timeout", type=int, default=10)
    parser.add_argument(
        "--cred-expire", type=int, default=120, help="AuthInfo cred_expire (Slurm's default 120 s)"
    )
    args = parser.parse_args()
    setup_django()
    os.environ.setdefault(
        "LOCKSTEP_PYTHON", sys.executable
    )  # the standbys Lockstep starts run the job's script
    with_runs, alone_runs, in_job_runs = [], [], []
    for index in range(args.runs):
        in_job = in_job_run(index, args.slurmd_timeout, args.cred_expire)
        in_job_runs.append(in_job)
        replaced = in_job["rank_replaced"]
        survivor = next(r["pid"] for r in in_job["before"] if r["rank"] == 0)
        restarted = "no" if replaced["survivor_pids"] == {"0": survivor} else "yes"
        print(
            f"run {index + 1}: in-job: node killed → training again {in_job['seconds']['total']:.1f} s; "
            f"iterations lost {replaced['lost_iterations']}; survivors restarted: {restarted}",
            flush=True,
        )
        lockstep, alone = one_run(index, args.slurmd_timeout, args.cred_expire)
        with_runs.append(lockstep)
        alone_runs.append(alone)
        print(
            f"run {index + 1}: with Lockstep {lockstep['seconds']['total']:.1f} s "
            f"(lost {lockstep['iteration_at_fault'] - lockstep['action'].restore_iteration} iterations, "
            f"booked {lockstep['action'].work_lost_seconds:.1f} s of work); "
            f"Slurm alone: {', '.join(f'{k} {v:.1f} s' for k, v in alone['seconds'].items())}",
            flush=True,
        )
    print(
        f"\nSlurmdTimeout={args.slurmd_timeout} s, cred_expire={args.cred_expire} s, {args.runs} runs, seconds after the node died, median (min–max)"
    )
    print("in-job (rank replaced by a standby, with Lockstep)")
    for key in ("notice", "detect", "decide", "replace", "total"):
        print(f"  {key:<14} {spread([run['seconds'][key] for run in in_job_runs])}")
    lost = [run["rank_replaced"]["lost_iterations"] for run in in_job_runs]
    print(f"  iterations lost: {', '.join(map(str, lost))}")
    print("requeue (with Lockstep, unprotected)")
    for key in ("detect", "decide", "slurm_requeue", "job_restart", "total"):
        print(f"  {key:<14} {spread([run['seconds'][key] for run in with_runs])}")
    print("Slurm alone")
    keys = sorted({key for run in alone_runs for key in run["seconds"]})
    for key in keys:
        values = [run["seconds"][key] for run in alone_runs if key in run["seconds"]]
        print(f"  {key:<14} {spread(values)}  ({len(values)}/{len(alone_runs)} runs)")
    lost = sum(run["lost"] for run in alone_runs)
    print(f"  job lost (ended, not requeued) in {lost}/{len(alone_runs)} runs")


if __name__ == "__main__":
    main()
