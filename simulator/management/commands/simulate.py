"""``manage.py simulate <subcommand>``: act on the simulated fleet from outside Lockstep.

Subcommands are registered in SUBCOMMANDS (name -> (help, add_arguments, handle)) so later simulator work adds its
own without touching the others.
"""

from django.core.management.base import BaseCommand, CommandError

from fleet.drivers import DriverError
from fleet.drivers.simulated import DRIFT_KINDS, simulate_drift
from fleet.models import Cluster


def _drift_arguments(parser):
    parser.add_argument("--cluster", required=True, help="the simulated cluster's name")
    parser.add_argument("--addon", help="which add-on (default: the first by name; for extra, the new one's name)")
    parser.add_argument("--kind", choices=DRIFT_KINDS, default="version",
                        help="version bump, values change, remove, an extra add-on, or degrade the release")
    parser.add_argument("--version", default="", help="the version to drift to (version and extra)")


def _drift(command, options):
    cluster = Cluster.objects.filter(name=options["cluster"]).first()
    if cluster is None:
        raise CommandError(f"no cluster named {options['cluster']}")
    try:
        done = simulate_drift(cluster, addon=options.get("addon"), kind=options["kind"], version=options["version"])
    except DriverError as error:
        raise CommandError(str(error)) from error
    command.stdout.write(done)


SUBCOMMANDS = {
    "drift": ("change a simulated cluster's add-ons out of band, to create drift", _drift_arguments, _drift),
}


class Command(BaseCommand):
    help = "Act on the simulated fleet from outside Lockstep."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True)
        for name, (text, arguments, _) in SUBCOMMANDS.items():
            arguments(sub.add_parser(name, help=text))

    def handle(self, *args, subcommand, **options):
        SUBCOMMANDS[subcommand][2](self, options)
