"""The lockstep-agent command: collect every interval, send (or print) one batch, repeat."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time

from lockstep_agent import __version__
from lockstep_agent.batch import make_batch
from lockstep_agent.gpu import GPUCollector, GPUUnavailable
from lockstep_agent.nic import NICCollector

log = logging.getLogger("lockstep_agent")

EXIT_NO_GPU = 2
EXIT_USAGE = 64


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="lockstep-agent",
        description="Send this node's GPU, NIC and facility telemetry to Lockstep (docs/agent.md).",
    )
    parser.add_argument("--url", default=env("LOCKSTEP_URL"), help="control plane base URL, or the full ingest URL [LOCKSTEP_URL]")
    parser.add_argument("--token", default=env("LOCKSTEP_TOKEN"), help="the cluster's agent token [LOCKSTEP_TOKEN]")
    parser.add_argument(
        "--node", default=env("LOCKSTEP_NODE") or socket.gethostname(), help="this node's hostname in Lockstep [LOCKSTEP_NODE, else the hostname]"
    )
    parser.add_argument(
        "--interval", type=float, default=_env_float("LOCKSTEP_INTERVAL", 10.0), help="seconds between batches [LOCKSTEP_INTERVAL, 10]"
    )
    parser.add_argument("--once", action="store_true", help="collect and send one batch, then exit")
    parser.add_argument("--count", type=int, default=0, help="stop after this many batches (0: run until stopped)")
    parser.add_argument("--dry-run", action="store_true", help="print each batch as JSON on stdout instead of sending it")
    parser.add_argument(
        "--spool-dir",
        default=env("LOCKSTEP_SPOOL_DIR", "/var/lib/lockstep-agent"),
        help="where undelivered batches wait [LOCKSTEP_SPOOL_DIR, /var/lib/lockstep-agent]",
    )
    parser.add_argument("--require-gpus", action="store_true", help="exit with status 2 when NVML or GPUs are missing")
    parser.add_argument("--no-gpus", action="store_true", help="do not load NVML at all (NIC and facility telemetry only)")
    parser.add_argument("--sysfs-root", default=env("LOCKSTEP_SYSFS_ROOT", "/sys"), help="sysfs mount [LOCKSTEP_SYSFS_ROOT, /sys]")
    parser.add_argument("--include-virtual-nics", action="store_true", help="also report interfaces without a device (lo, bridges)")
    parser.add_argument(
        "--redfish-url",
        action="append",
        default=[u for u in (env("LOCKSTEP_REDFISH_URL") or "").split(",") if u],
        help="this node's BMC Redfish base URL; repeatable [LOCKSTEP_REDFISH_URL, comma-separated]",
    )
    parser.add_argument("--redfish-username", default=env("LOCKSTEP_REDFISH_USERNAME"), help="[LOCKSTEP_REDFISH_USERNAME]")
    parser.add_argument("--redfish-password", default=env("LOCKSTEP_REDFISH_PASSWORD"), help="[LOCKSTEP_REDFISH_PASSWORD]")
    parser.add_argument(
        "--facility-config", default=env("LOCKSTEP_FACILITY_CONFIG"), help="JSON file of BMCs, CDUs and PDUs to poll [LOCKSTEP_FACILITY_CONFIG]"
    )
    parser.add_argument(
        "--facility-interval",
        type=float,
        default=_env_float("LOCKSTEP_FACILITY_INTERVAL", 30.0),
        help="seconds between Redfish polls [LOCKSTEP_FACILITY_INTERVAL, 30]",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(env("LOCKSTEP_METRICS_PORT") or 0),
        help="serve the GPU readings on this port at /metrics under dcgm-exporter's names (9400 where no dcgm-exporter "
        "runs); 0: off [LOCKSTEP_METRICS_PORT, 0]",
    )
    parser.add_argument(
        "--metrics-address", default=env("LOCKSTEP_METRICS_ADDRESS", "0.0.0.0"), help="address /metrics listens on [LOCKSTEP_METRICS_ADDRESS, 0.0.0.0]"
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout towards the control plane, seconds")
    parser.add_argument("--retries", type=int, default=3, help="attempts per batch before it is spooled")
    parser.add_argument("--backoff", type=float, default=1.0, help="first retry delay, seconds; doubles up to --max-backoff")
    parser.add_argument("--max-backoff", type=float, default=60.0)
    parser.add_argument("--log-level", default=env("LOCKSTEP_LOG_LEVEL", "INFO"))
    parser.add_argument("--version", action="version", version=f"lockstep-agent {__version__}")
    return parser


def _facility_collector(args):
    from lockstep_agent.facility import FacilityCollector, RedfishSource, load_sources

    sources = []
    if args.facility_config:
        sources.extend(load_sources(args.facility_config, default_node=args.node))
    for url in args.redfish_url:
        sources.append(
            RedfishSource(url=url, scope="node", target=args.node, username=args.redfish_username, password=args.redfish_password)
        )
    return FacilityCollector(sources) if sources else None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="lockstep-agent %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not args.dry_run and not args.url:
        print("lockstep-agent: --url (or LOCKSTEP_URL) is required unless --dry-run", file=sys.stderr)
        return EXIT_USAGE
    count = 1 if args.once else max(0, args.count)

    gpus: GPUCollector | None = None
    gpu_status, gpu_reason = ("disabled", "started with --no-gpus") if args.no_gpus else ("ok", None)
    if not args.no_gpus:
        gpus = GPUCollector()
        try:
            gpus.open()
        except GPUUnavailable as error:
            gpus, gpu_status, gpu_reason = None, error.status, error.reason
            # Said once, here; batches carry gpu_status so the server knows why readings[] is empty.
            if args.require_gpus:
                print(f"lockstep-agent: no GPU to read: {error.reason}; exiting (--require-gpus)", file=sys.stderr)
                return EXIT_NO_GPU
            print(f"lockstep-agent: no GPU to read: {error.reason}; collecting NICs only", file=sys.stderr)
    elif args.require_gpus:
        print("lockstep-agent: --require-gpus with --no-gpus: nothing to require", file=sys.stderr)
        return EXIT_USAGE

    exported = None
    if args.metrics_port:
        try:
            from lockstep_agent.metrics import DCGMCollector, serve
        except ImportError as error:
            print(f"lockstep-agent: --metrics-port needs prometheus_client (pip install lockstep-agent[metrics]): {error}", file=sys.stderr)
            return EXIT_USAGE
        exported = DCGMCollector(hostname=args.node, gpus=gpus)
        try:
            metrics_server, _ = serve(exported, port=args.metrics_port, address=args.metrics_address)
        except OSError as error:
            print(f"lockstep-agent: cannot serve /metrics on {args.metrics_address}:{args.metrics_port}: {error}", file=sys.stderr)
            return EXIT_USAGE
        log.info("serving /metrics on %s:%d", args.metrics_address, args.metrics_port)

    nics = NICCollector(args.sysfs_root, include_virtual=args.include_virtual_nics)
    facility = _facility_collector(args)
    sender = None
    if not args.dry_run:
        from lockstep_agent.sender import Sender
        from lockstep_agent.spool import Spool

        try:
            spool = Spool(args.spool_dir)
        except OSError as error:
            print(f"lockstep-agent: cannot use the spool directory {args.spool_dir}: {error} (see --spool-dir)", file=sys.stderr)
            return EXIT_USAGE
        sender = Sender(
            url=args.url,
            token=args.token,
            spool=spool,
            timeout=args.timeout,
            attempts=args.retries,
            backoff=args.backoff,
            max_backoff=args.max_backoff,
        )
        if not args.token:
            log.warning("no token (--token / LOCKSTEP_TOKEN): the control plane will refuse the batches")

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(signum, lambda *_: stop.set())
        except ValueError:  # not the main thread (tests calling main() from a thread)
            pass

    sent = 0
    next_facility = 0.0
    try:
        while not stop.is_set():
            started = time.monotonic()
            facility_points = []
            if facility is not None and started >= next_facility:
                facility_points = facility.collect()
                next_facility = started + args.facility_interval
            readings = gpus.collect() if gpus else []
            if exported is not None:
                exported.update(readings)
            batch = make_batch(
                node=args.node,
                gpu_status=gpu_status,
                gpu_status_reason=gpu_reason,
                driver_version=gpus.driver_version if gpus else None,
                readings=readings,
                events=gpus.take_events() if gpus else [],
                nics=nics.collect(),
                facility=facility_points,
            )
            if sender is None:
                sys.stdout.write(json.dumps(batch, indent=2, sort_keys=True) + "\n")
                sys.stdout.flush()
            else:
                outcome = sender.ship(batch)
                log.debug("batch %s: %s", batch["batch_id"], outcome.value)
            sent += 1
            if count and sent >= count:
                break
            remaining = args.interval - (time.monotonic() - started)
            while remaining > 0 and not stop.is_set():
                step = min(remaining, 1.0)
                if gpus is not None:
                    gpus.wait_for_events(step)  # Xids arrive while we wait
                else:
                    stop.wait(step)
                remaining = args.interval - (time.monotonic() - started)
    finally:
        if exported is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        if gpus is not None:
            gpus.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
