"""``manage.py simulate <subcommand>``: act on the simulated fleet from outside Lockstep.

Subcommands are registered in SUBCOMMANDS (name -> (help, add_arguments, handle)) so later simulator work adds its
own without touching the others.
"""

import os
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from fleet.drivers import DriverError
from fleet.drivers.simulated import (
    DRIFT_KINDS,
    FAILURE_KINDS,
    RECOVERY_OPERATIONS,
    fail_next_health_check,
    fail_next_recovery,
    simulate_drift,
)
from fleet.models import Cluster
from simulator.profiles import PROFILES


def _drift_arguments(parser):
    parser.add_argument("--cluster", required=True, help="the simulated cluster's name")
    parser.add_argument(
        "--addon", help="which add-on (default: the first by name; for extra, the new one's name)"
    )
    parser.add_argument(
        "--kind",
        choices=DRIFT_KINDS,
        default="version",
        help="version bump, values change, remove, an extra add-on, or degrade the release",
    )
    parser.add_argument("--version", default="", help="the version to drift to (version and extra)")


def _named_cluster(name: str) -> Cluster:
    cluster = Cluster.objects.filter(name=name).first()
    if cluster is None:
        raise CommandError(f"no cluster named {name}")
    return cluster


def _drift(command, options):
    cluster = _named_cluster(options["cluster"])
    try:
        done = simulate_drift(
            cluster, addon=options.get("addon"), kind=options["kind"], version=options["version"]
        )
    except DriverError as error:
        raise CommandError(str(error)) from error
    command.stdout.write(done)


def _fail_next_arguments(parser):
    parser.add_argument("--cluster", required=True, help="the simulated cluster's name")
    parser.add_argument("--count", type=int, default=1, help="how many recovery operations fail")
    parser.add_argument(
        "--operation",
        action="append",
        choices=sorted(op.value for op in RECOVERY_OPERATIONS),
        help="only this recovery operation (repeatable; default: any)",
    )
    parser.add_argument(
        "--how",
        choices=FAILURE_KINDS,
        default="fail",
        help="fail: started, then reported failed; refuse: the cluster refuses the call",
    )


def _fail_next(command, options):
    cluster = _named_cluster(options["cluster"])
    try:
        done = fail_next_recovery(
            cluster, count=options["count"], operations=options["operation"], how=options["how"]
        )
    except DriverError as error:
        raise CommandError(str(error)) from error
    command.stdout.write(done)


def _fail_health_check_arguments(parser):
    parser.add_argument("--cluster", required=True, help="the simulated cluster's name")
    parser.add_argument("--count", type=int, default=1, help="how many health checks fail")
    parser.add_argument(
        "--how",
        choices=FAILURE_KINDS,
        default="fail",
        help="fail: the check runs and reports failed; refuse: the cluster refuses to run it",
    )


def _fail_health_check(command, options):
    cluster = _named_cluster(options["cluster"])
    try:
        done = fail_next_health_check(cluster, count=options["count"], how=options["how"])
    except DriverError as error:
        raise CommandError(str(error)) from error
    command.stdout.write(done)


def _world_arguments(parser):
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--nodes", type=int, default=64, help="ready nodes per cluster (plus --spares)")
    parser.add_argument("--spares", type=int, default=8)


def _world(command, options):
    from simulator.world import world_build

    built = world_build(seed=options["seed"], nodes_per_cluster=options["nodes"], spares=options["spares"])
    if not built.created:
        command.stdout.write(f"A demo world exists (seed {built.world.seed}); nothing to build.")
        return
    command.stdout.write(
        command.style.SUCCESS("Demo world built: 2 tenants, 2 fleets, 4 clusters, jobs running.")
    )
    for username, password in built.passwords.items():
        command.stdout.write(f"  tenant user {username!r} password {password!r} (shown once)")


def _run_arguments(parser):
    _world_arguments(parser)
    parser.add_argument(
        "--url",
        default=os.environ.get("LOCKSTEP_URL", "http://127.0.0.1:8000"),
        help="the control plane to speak to [LOCKSTEP_URL]",
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="llama3")
    parser.add_argument(
        "--acceleration",
        type=float,
        default=settings.SIMULATOR_ACCELERATION,
        help="how much faster than real time faults strike (demo time compression) [SIMULATOR_ACCELERATION]",
    )
    parser.add_argument("--tick", type=float, default=10.0, help="seconds between telemetry batches")
    parser.add_argument(
        "--ticks", type=int, default=None, help="stop after this many ticks (default: run until stopped)"
    )
    parser.add_argument(
        "--showcase-after",
        type=float,
        default=settings.SIMULATOR_SHOWCASE_SECONDS,
        help="seconds after start to stage one NIC failure under the largest protected job, so the demo shows "
        "protection early; negative: none [SIMULATOR_SHOWCASE_SECONDS]",
    )


def _run(command, options):
    import requests

    from simulator.runner import Runner
    from simulator.world import DEMO_RECOVERY_FAILURE_PROBABILITY, world_set_recovery_failures

    _world(command, options)
    names = world_set_recovery_failures(probability=DEMO_RECOVERY_FAILURE_PROBABILITY)
    command.stdout.write(
        f"{DEMO_RECOVERY_FAILURE_PROBABILITY:.0%} of recovery operations fail on {', '.join(names)}."
    )
    url = options["url"].rstrip("/")
    for _ in range(240):
        try:
            if requests.get(f"{url}/healthz", timeout=2).ok:
                break
        except requests.RequestException:
            time.sleep(0.5)
    runner = Runner(
        url=url,
        profile=options["profile"],
        acceleration=options["acceleration"],
        tick_seconds=options["tick"],
        showcase_after=options["showcase_after"] if options["showcase_after"] >= 0 else None,
    )
    command.stdout.write(f"Simulating {runner.describe()}; speaking to {url}.")
    if runner.showcase_due is not None:
        command.stdout.write(
            f"A staged NIC failure strikes the largest protected job {options['showcase_after']:g} s from now."
        )
    try:
        stats = runner.run(ticks=options["ticks"])
    except KeyboardInterrupt:
        stats = runner.stats
    command.stdout.write(
        f"{stats.ticks} ticks, {stats.batches_sent} batches sent, {len(stats.strikes)} interruptions."
    )


def _whatif_arguments(parser):
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gpus", type=int, default=16_384)
    parser.add_argument("--days", type=float, default=54)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="llama3")
    parser.add_argument("--checkpoint-minutes", type=float, default=30)
    parser.add_argument("--restart-overhead-minutes", type=float, default=10)
    parser.add_argument("--checkpoint-write-seconds", type=float, default=30)
    parser.add_argument("--migration-pause-seconds", type=float, default=30)
    parser.add_argument("--spare-fraction", type=float, default=0.02)
    parser.add_argument("--json", action="store_true", help="print the whole report as one JSON document")
    parser.add_argument(
        "--formula-only",
        action="store_true",
        help="only the formula replay (seconds): leave out the replay through Lockstep's own services (real_path)",
    )
    parser.add_argument(
        "--real-path",
        action="store_true",
        help="(the default) also replay the interruptions through Lockstep's own services in a scratch store"
        " (report: real_path), with the sensitivity table's price rows re-costed from what it recorded",
    )
    parser.add_argument(
        "--real-path-sensitivity",
        action="store_true",
        help="also replay the capacity rows (spare share, repair time, failed recoveries, rack failures, software"
        " crashes) through the real path: ten more replays, two at a time (minutes, not seconds)",
    )


def _whatif(command, options):
    """The report on stdout (text, or one JSON document with --json); progress and timing on stderr."""
    import json

    from controlplane.errors import ServiceError
    from simulator.services.whatifs import clean_config
    from simulator.whatif import whatif_run
    from simulator.whatif_text import format_report

    keys = (
        "seed",
        "gpus",
        "days",
        "profile",
        "checkpoint_minutes",
        "restart_overhead_minutes",
        "checkpoint_write_seconds",
        "migration_pause_seconds",
        "spare_fraction",
    )
    try:
        config = clean_config({key: options[key] for key in keys})
    except ServiceError as error:
        raise CommandError(f"{error.field}: {error.detail}") from error
    started = time.monotonic()
    shown = [-1]

    def progress(share: float) -> None:
        percent = int(share * 100)
        if percent // 10 != shown[0] // 10:
            shown[0] = percent
            command.stderr.write(f"replaying… {percent} %")

    if options["formula_only"] and (options["real_path"] or options["real_path_sensitivity"]):
        raise CommandError("--formula-only leaves the real path out: drop --real-path(-sensitivity)")
    real_path = None
    if not options["formula_only"]:
        from simulator.replay_sensitivity import real_path_beside

        # its scratch processes start first and run beside the formula replay (the machine has two cores)
        command.stderr.write("replaying through Lockstep's services in a scratch store…")
        real_path = real_path_beside(config, replay=options["real_path_sensitivity"])
    report = whatif_run(config, progress=progress)
    command.stderr.write(f"replayed in {time.monotonic() - started:.2f} s")
    if real_path is not None:
        try:
            report["real_path"] = real_path.result()
        except RuntimeError as error:
            raise CommandError(str(error)) from error
        if "timing" in report["real_path"]:
            replayed = report["real_path"]["timing"]["replay_seconds"]
            command.stderr.write(f"real path replayed in {replayed:.1f} s")
    command.stdout.write(json.dumps(report, indent=2) if options["json"] else format_report(report))


def _real_path_arguments(parser):
    parser.add_argument(
        "--config",
        required=True,
        help="the what-if's configuration, as JSON; a list of them replays each in turn (a list of reports)",
    )
    parser.add_argument(
        "--strikes", help="these interruptions (JSON list of simulator.sampling.Strike) instead"
    )
    parser.add_argument("--connection", help="the simulated driver's settings to override (JSON object)")


def _real_path(command, options):
    """Real-path replays on the scratch settings (run_in_scratch starts them): the report as JSON on stdout (a list of
    reports for a list of configurations, each replayed on a fresh store)."""
    import json

    from controlplane.errors import ServiceError
    from simulator.replay import NotScratch, replay_real_path
    from simulator.sampling import Strike
    from simulator.services.whatifs import clean_config

    try:
        given = json.loads(options["config"])
        configs = [clean_config(item) for item in (given if isinstance(given, list) else [given])]
        strikes = [Strike(**item) for item in json.loads(options["strikes"])] if options["strikes"] else None
        connection = json.loads(options["connection"]) if options["connection"] else None
    except (ServiceError, ValueError, TypeError) as error:
        raise CommandError(
            f"--config, --strikes or --connection: {getattr(error, 'detail', error)}"
        ) from error
    try:
        reports = [replay_real_path(config, strikes=strikes, connection=connection) for config in configs]
    except NotScratch as error:
        raise CommandError(str(error)) from error
    command.stdout.write(json.dumps(reports if isinstance(given, list) else reports[0]))


def _abnic_arguments(parser):
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--strike-after", type=float, default=90.0, help="seconds until the NIC fails")


def _abnic(command, options):
    from controlplane.errors import ServiceError
    from simulator.services.scenarios import abnic_start
    from simulator.world import SERVICE_USER
    from tenancy.models import Membership

    actor = Membership.objects.filter(user__username=SERVICE_USER).select_related("user").first()
    if actor is None:
        raise CommandError("build the demo world first: manage.py simulate world")
    try:
        scenario = abnic_start(
            actor=actor.user, gpus=options["gpus"], strike_after_seconds=options["strike_after"]
        )
    except ServiceError as error:
        raise CommandError(error.detail) from error
    command.stdout.write(
        f"ab-nic #{scenario.pk}: jobs {scenario.jobs}; NIC {scenario.nic_name} fails at "
        f"{scenario.strike_at:%H:%M:%S} (beat fires it). Watch /scenarios/{scenario.pk}/"
    )


SUBCOMMANDS = {
    "ab-nic": ("two identical jobs, protected and not, lose the same NIC", _abnic_arguments, _abnic),
    "what-if": (
        "replay a long training run through Lockstep's planner, without and with protection",
        _whatif_arguments,
        _whatif,
    ),
    "real-path": (
        "the what-if's interruptions through Lockstep's own services (scratch settings only; what-if runs it)",
        _real_path_arguments,
        _real_path,
    ),
    "drift": ("change a simulated cluster's add-ons out of band, to create drift", _drift_arguments, _drift),
    "fail-next": (
        "make a simulated cluster's next recovery operations fail or be refused",
        _fail_next_arguments,
        _fail_next,
    ),
    "fail-health-check": (
        "make a simulated cluster's next health checks of repaired nodes fail",
        _fail_health_check_arguments,
        _fail_health_check,
    ),
    "world": ("build the demo world if there is none", _world_arguments, _world),
    "run": (
        "build the demo world if needed, then run it: telemetry, jobs, faults (the default)",
        _run_arguments,
        _run,
    ),
}


class Command(BaseCommand):
    help = "Act on the simulated fleet from outside Lockstep."

    def run_from_argv(self, argv):
        # `manage.py simulate` alone runs the world, as `make run` and docker compose start it.
        if len(argv) == 2 or argv[2].startswith("-") and argv[2] not in ("-h", "--help"):
            argv = [*argv[:2], "run", *argv[2:]]
        return super().run_from_argv(argv)

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True)
        for name, (text, arguments, _) in SUBCOMMANDS.items():
            arguments(sub.add_parser(name, help=text))

    def handle(self, *args, subcommand, **options):
        SUBCOMMANDS[subcommand][2](self, options)
