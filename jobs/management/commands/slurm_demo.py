"""``manage.py slurm_demo``: a local three-node Slurm with a real training job, added to the demo world.

Starts munged, slurmctld and three slurmd under ``var/slurm-demo/`` (jobs/local_slurm/; needs root,
slurm-wlm, munge and torch), registers it as cluster ``slurm-demo-N`` (driver slurm; account ``demo`` → the first
tenant, or one it creates), submits agent/lockstep_agent/examples/train_slurm.sh on two nodes with a launcher
credential, and after ``--fail-after`` seconds kills node n2 under the job. The running stack (``make run``:
beat's Slurm sync and recovery) sees the node die, drains it and requeues the job on the spare. Ctrl-C stops the
Slurm daemons.
"""

import shutil
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Start a local Slurm with a running training job and add it to the demo world (make slurm-demo)."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="where the job reaches Lockstep")
        parser.add_argument(
            "--fail-after", type=float, default=60.0, help="kill node n2 after this many seconds (0: never)"
        )
        parser.add_argument("--folder", default=str(Path(settings.BASE_DIR) / "var" / "slurm-demo"))

    def handle(self, *args, **options):
        from fleet.choices import ClusterKind, DriverName
        from fleet.models import Cluster, Fleet
        from jobs.launchers import launcher_credential_create
        from jobs.local_slurm.cluster import SlurmCluster, available
        from jobs.local_slurm.training import kill_n2, submit_training
        from jobs.services.slurm_jobs import slurm_sync
        from tenancy.models import Tenant

        why = available()
        if why:
            raise CommandError(why)
        folder = Path(options["folder"])
        shutil.rmtree(folder, ignore_errors=True)
        with SlurmCluster(folder / "slurm") as slurm:
            tenant = Tenant.objects.order_by("pk").first() or Tenant.objects.create(name="Demo", slug="demo")
            fleet = Fleet.objects.order_by("pk").first() or Fleet.objects.create(name="demo")
            # A fresh cluster each time: an earlier demo's nodes and jobs stay as they ended.
            number = Cluster.objects.filter(name__startswith="slurm-demo").count() + 1
            cluster = Cluster.objects.create(
                name=f"slurm-demo-{number}",
                fleet=fleet,
                driver=DriverName.SLURM,
                kind=ClusterKind.SLURM,
                connection=slurm.connection(accounts={"demo": tenant.slug}, gpu_model="H100"),
            )
            slurm_sync(cluster=cluster)
            _, token = launcher_credential_create(actor=None, cluster=cluster, name="slurm-demo")
            slurm_id = submit_training(
                slurm,
                folder / "run",
                account="demo",
                env={"LOCKSTEP_URL": options["url"], "LOCKSTEP_LAUNCHER_TOKEN": token},
            )
            self.stdout.write(
                f"Slurm job {slurm_id} training on cluster {cluster.name} (tenant {tenant.slug}); "
                f"log {folder / 'run'}/job-{slurm_id}.out; SLURM_CONF={slurm.conf}"
            )
            started = time.monotonic()
            failed = False
            try:
                while True:
                    time.sleep(1)
                    if (
                        options["fail_after"]
                        and not failed
                        and time.monotonic() - started >= options["fail_after"]
                    ):
                        kill_n2(slurm, folder / "run")
                        failed = True
                        self.stdout.write(
                            "node n2 died (slurmd and ranks killed): watch the job page recover it"
                        )
            except KeyboardInterrupt:
                self.stdout.write("stopping Slurm")
