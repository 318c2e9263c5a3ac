"""Benchmark (not a timed test): the A/B on a real Slurm — two real PyTorch jobs, one protected, one not, a node
killed under each at a random iteration (issue 18).

Each run starts a fresh seven-node Slurm (munged, slurmctld, seven ``slurmd -N``, a snapshot holder per node;
jobs/local_slurm/cluster.py: 5 training nodes + 2 hot spares, one CPU a node) on a Lockstep cluster whose policy
turns the protection runtime on, and a real uvicorn server the jobs register with and report to; beat's work
(Slurm sync, fault handling, recovery advance) runs every 0.25 s. Both jobs run
agent/lockstep_agent/examples/train_slurm.py on two nodes (gloo, a checkpoint every ``--checkpoint-every`` steps,
steps padded to 50 ms); the protected one (issue 49) under the protection runtime with a standby in its own
allocation (a snapshot every step, replicated to the peer node), the unprotected one without it. Once the
unprotected job is a random number of steps past a checkpoint, the node of each job's rank 1 dies (slurmd, rank,
snapshot holder SIGKILLed together): the protected job's standby takes the lost rank in place while its survivor
keeps running (rank_replacement), the other is requeued and restarted from its checkpoint
(restart_from_checkpoint). ``--requeue-protected`` runs the protected job without a standby instead: restored from
memory on a spare after a requeue (restore_from_snapshot, issue 18's A/B).

Printed per arm, from the jobs' own progress reports: iterations lost (last report before the recovery started −
the iteration it resumed from), what the ledger booked, and the time from the kill to the first training step
after the relaunch.

Run: .venv/bin/python bench/slurm_protection.py [--runs 5] [--checkpoint-every 40] [--snapshot-every 5]
Needs slurm-wlm, munge, root and torch; a PostgreSQL at BENCH_ADMIN_DATABASE_URL (scratch database
lockstep_bench_protection) and Redis at BENCH_REDIS_URL.
"""

import argparse
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DB_NAME = "lockstep_bench_protection"
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


def one_run(index: int, args, kill_after: int) -> dict:
    from fleet.choices import ClusterKind, DriverName
    from fleet.models import Blueprint, BlueprintVersion, Cluster, Fleet
    from jobs.launchers import launcher_credential_create
    from jobs.local_slurm.cluster import SlurmCluster
    from jobs.services.slurm_jobs import slurm_sync
    from tenancy.models import Tenant
    from tests.support.processes import uvicorn_server
    from tests.support.slurm_scenario import ab_run

    folder = Path(tempfile.mkdtemp(prefix="lockstep-bench-protection-"))
    tenant = Tenant.objects.create(name=f"Bench {index}", slug=f"bench-{index}")
    blueprint = Blueprint.objects.create(name=f"bench-runtime-{index}")
    version = BlueprintVersion.objects.create(
        blueprint=blueprint, number=1, state="active", addons=[], policy={"protection": {"runtime": True}}
    )
    with (
        SlurmCluster(folder / "slurm", nodes=7, spare_nodes=2, cpus=1, holders=True) as slurm,
        uvicorn_server(folder) as server,
    ):
        fleet = Fleet.objects.create(name=f"bench-protection-{index}")
        cluster = Cluster.objects.create(
            fleet=fleet,
            name=f"bench-protection-{index}",
            driver=DriverName.SLURM,
            kind=ClusterKind.SLURM,
            blueprint=blueprint,
            blueprint_version=version,
            connection=slurm.connection(accounts={"acme": tenant.slug}, gpu_model="H100"),
        )
        slurm_sync(cluster=cluster)
        _, token = launcher_credential_create(actor=None, cluster=cluster, name="bench")
        return ab_run(
            slurm,
            cluster,
            folder / "ab",
            launcher_token=token,
            url=server.url,
            checkpoint_every=args.checkpoint_every,
            snapshot_every=args.snapshot_every,
            kill_after=kill_after,
            standbys=0 if args.requeue_protected else 1,
        )


def spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.mean(values):.{digits}f} mean, {statistics.median(values):.{digits}f} median ({min(values):.{digits}f}–{max(values):.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--checkpoint-every", type=int, default=40)
    parser.add_argument("--snapshot-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument(
        "--requeue-protected",
        action="store_true",
        help="the protected job without a standby: restored from memory after a requeue (issue 18's A/B)",
    )
    args = parser.parse_args()
    setup_django()
    rng = random.Random(args.seed)
    runs = []
    for index in range(args.runs):
        kill_after = rng.randrange(1, args.checkpoint_every)
        run = one_run(index, args, kill_after)
        runs.append(run)
        line = [f"run {index + 1} (killed {kill_after} steps past the unprotected job's checkpoint):"]
        for arm in ("protected", "unprotected"):
            figures = run[arm]
            line.append(
                f"{arm} {figures['action'].kind} from {figures['resumed']['from']}: lost "
                f"{figures['lost_iterations']} it ({figures['reached']} → {figures['restored']}), booked "
                f"{figures['action'].work_lost_seconds:.2f} s work + {figures['action'].pause_seconds:.1f} s pause + "
                f"{figures['action'].snapshot_overhead_seconds:.2f} s snapshot overhead, "
                f"saved {figures['action'].gpu_hours_saved:.4f} GPU-h, training again after "
                f"{figures['resume_seconds']:.1f} s;"
            )
        print(" ".join(line), flush=True)
    print(
        f"\n{args.runs} runs, a checkpoint every {args.checkpoint_every} steps, a snapshot every "
        f"{args.snapshot_every} steps, 50 ms steps"
    )
    for arm in ("protected", "unprotected"):
        print(arm)
        print(f"  iterations lost   {spread([r[arm]['lost_iterations'] for r in runs])}")
        print(f"  work lost (s)     {spread([r[arm]['lost_seconds'] for r in runs], 2)}")
        print(f"  kill → training   {spread([r[arm]['resume_seconds'] for r in runs])} s")
        print(
            f"  snapshot overhead {spread([r[arm]['action'].snapshot_overhead_seconds for r in runs], 2)} s booked"
        )
        print(f"  resumed from      {', '.join(sorted({r[arm]['resumed']['from'] for r in runs}))}")
        if "survivor_pids" in runs[0][arm]:
            kept = sum(r[arm]["survivor_pids"][0] == r[arm]["survivor_pids"][1] for r in runs)
            print(f"  survivor kept its process in {kept}/{len(runs)} runs")
    print(
        f"half a checkpoint interval: {args.checkpoint_every / 2:.0f} iterations; one snapshot interval: "
        f"{args.snapshot_every}"
    )


if __name__ == "__main__":
    main()
