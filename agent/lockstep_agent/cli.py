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
from dataclasses import dataclass

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


def _add_control_plane_arguments(parser: argparse.ArgumentParser) -> None:
    """The control plane the batches go to, and the node they speak for."""
    env = os.environ.get
    parser.add_argument(
        "--url",
        default=env("LOCKSTEP_URL"),
        help="control plane base URL, or the full ingest URL [LOCKSTEP_URL]",
    )
    parser.add_argument(
        "--token", default=env("LOCKSTEP_TOKEN"), help="the cluster's agent token [LOCKSTEP_TOKEN]"
    )
    parser.add_argument(
        "--node",
        default=env("LOCKSTEP_NODE") or socket.gethostname(),
        help="this node's hostname in Lockstep [LOCKSTEP_NODE, else the hostname]",
    )


def _add_batch_arguments(parser: argparse.ArgumentParser) -> None:
    """How often a batch is made, how many, and what becomes of it: printed, or spooled until delivered."""
    env = os.environ.get
    parser.add_argument(
        "--interval",
        type=float,
        default=_env_float("LOCKSTEP_INTERVAL", 10.0),
        help="seconds between batches [LOCKSTEP_INTERVAL, 10]",
    )
    parser.add_argument("--once", action="store_true", help="collect and send one batch, then exit")
    parser.add_argument(
        "--count", type=int, default=0, help="stop after this many batches (0: run until stopped)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print each batch as JSON on stdout instead of sending it"
    )
    parser.add_argument(
        "--spool-dir",
        default=env("LOCKSTEP_SPOOL_DIR", "/var/lib/lockstep-agent"),
        help="where undelivered batches wait [LOCKSTEP_SPOOL_DIR, /var/lib/lockstep-agent]",
    )


def _add_collection_arguments(parser: argparse.ArgumentParser) -> None:
    """What is read on the node itself: its GPUs (through NVML) and its NICs (through sysfs)."""
    env = os.environ.get
    parser.add_argument(
        "--require-gpus", action="store_true", help="exit with status 2 when NVML or GPUs are missing"
    )
    parser.add_argument(
        "--no-gpus", action="store_true", help="do not load NVML at all (NIC and facility telemetry only)"
    )
    parser.add_argument(
        "--sysfs-root",
        default=env("LOCKSTEP_SYSFS_ROOT", "/sys"),
        help="sysfs mount [LOCKSTEP_SYSFS_ROOT, /sys]",
    )
    parser.add_argument(
        "--include-virtual-nics",
        action="store_true",
        help="also report interfaces without a device (lo, bridges)",
    )


def _add_facility_arguments(parser: argparse.ArgumentParser) -> None:
    """The node's BMC and the facility's CDUs and PDUs to poll over Redfish, and how often."""
    env = os.environ.get
    parser.add_argument(
        "--redfish-url",
        action="append",
        default=[u for u in (env("LOCKSTEP_REDFISH_URL") or "").split(",") if u],
        help="this node's BMC Redfish base URL; repeatable [LOCKSTEP_REDFISH_URL, comma-separated]",
    )
    parser.add_argument(
        "--redfish-username", default=env("LOCKSTEP_REDFISH_USERNAME"), help="[LOCKSTEP_REDFISH_USERNAME]"
    )
    parser.add_argument(
        "--redfish-password", default=env("LOCKSTEP_REDFISH_PASSWORD"), help="[LOCKSTEP_REDFISH_PASSWORD]"
    )
    parser.add_argument(
        "--facility-config",
        default=env("LOCKSTEP_FACILITY_CONFIG"),
        help="JSON file of BMCs, CDUs and PDUs to poll [LOCKSTEP_FACILITY_CONFIG]",
    )
    parser.add_argument(
        "--facility-interval",
        type=float,
        default=_env_float("LOCKSTEP_FACILITY_INTERVAL", 30.0),
        help="seconds between Redfish polls [LOCKSTEP_FACILITY_INTERVAL, 30]",
    )


def _add_metrics_arguments(parser: argparse.ArgumentParser) -> None:
    """The /metrics endpoint that serves the GPU readings under dcgm-exporter's names."""
    env = os.environ.get
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(env("LOCKSTEP_METRICS_PORT") or 0),
        help="serve the GPU readings on this port at /metrics under dcgm-exporter's names (9400 where no dcgm-exporter "
        "runs); 0: off [LOCKSTEP_METRICS_PORT, 0]",
    )
    parser.add_argument(
        "--metrics-address",
        default=env("LOCKSTEP_METRICS_ADDRESS", "0.0.0.0"),
        help="address /metrics listens on [LOCKSTEP_METRICS_ADDRESS, 0.0.0.0]",
    )


def _add_delivery_arguments(parser: argparse.ArgumentParser) -> None:
    """How a batch is sent to the control plane: timeout, retries and their backoff."""
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="HTTP timeout towards the control plane, seconds"
    )
    parser.add_argument("--retries", type=int, default=3, help="attempts per batch before it is spooled")
    parser.add_argument(
        "--backoff", type=float, default=1.0, help="first retry delay, seconds; doubles up to --max-backoff"
    )
    parser.add_argument("--max-backoff", type=float, default=60.0)


def build_parser() -> argparse.ArgumentParser:
    """The lockstep-agent command's options, in the order ``--help`` lists them."""
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="lockstep-agent",
        description="Send this node's GPU, NIC and facility telemetry to Lockstep (docs/agent.md).",
    )
    _add_control_plane_arguments(parser)
    _add_batch_arguments(parser)
    _add_collection_arguments(parser)
    _add_facility_arguments(parser)
    _add_metrics_arguments(parser)
    _add_delivery_arguments(parser)
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
            RedfishSource(
                url=url,
                scope="node",
                target=args.node,
                username=args.redfish_username,
                password=args.redfish_password,
            )
        )
    return FacilityCollector(sources) if sources else None


class _Refused(Exception):
    """A setup step that cannot go on: ``main`` prints the message and exits with the code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class _Sources:
    """What a batch is collected from, and the /metrics collector each GPU reading also goes to."""

    gpus: GPUCollector | None
    gpu_status: str
    gpu_reason: str | None
    nics: NICCollector
    facility: object | None
    exported: object | None = None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="lockstep-agent %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.dry_run and not args.url:
        print("lockstep-agent: --url (or LOCKSTEP_URL) is required unless --dry-run", file=sys.stderr)
        return EXIT_USAGE
    count = 1 if args.once else max(0, args.count)
    try:
        gpus, gpu_status, gpu_reason = _open_gpus(args)
        exported, metrics_server = _serve_metrics(args, gpus)
        nics = NICCollector(args.sysfs_root, include_virtual=args.include_virtual_nics)
        sources = _Sources(gpus, gpu_status, gpu_reason, nics, _facility_collector(args), exported)
        sender = None if args.dry_run else _sender(args)
    except _Refused as refused:
        print(f"lockstep-agent: {refused}", file=sys.stderr)
        return refused.code
    stop = _stop_on_signals()
    try:
        _send_batches(args, sources, sender, stop, count)
    finally:
        if exported is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        if gpus is not None:
            gpus.close()
    return 0


def _open_gpus(args) -> tuple[GPUCollector | None, str, str | None]:
    """The GPU collector (None without GPUs), with the status and reason every batch carries."""
    if args.no_gpus:
        if args.require_gpus:
            raise _Refused(EXIT_USAGE, "--require-gpus with --no-gpus: nothing to require")
        return None, "disabled", "started with --no-gpus"
    gpus = GPUCollector()
    try:
        gpus.open()
    except GPUUnavailable as error:
        # Said once, here; batches carry gpu_status so the server knows why readings[] is empty.
        if args.require_gpus:
            raise _Refused(EXIT_NO_GPU, f"no GPU to read: {error.reason}; exiting (--require-gpus)") from None
        print(f"lockstep-agent: no GPU to read: {error.reason}; collecting NICs only", file=sys.stderr)
        return None, error.status, error.reason
    return gpus, "ok", None


def _serve_metrics(args, gpus):
    """With --metrics-port, the dcgm-exporter-style collector and the /metrics server; else (None, None)."""
    if not args.metrics_port:
        return None, None
    try:
        from lockstep_agent.metrics import DCGMCollector, serve
    except ImportError as error:
        raise _Refused(
            EXIT_USAGE,
            f"--metrics-port needs prometheus_client (pip install lockstep-agent[metrics]): {error}",
        ) from None
    exported = DCGMCollector(hostname=args.node, gpus=gpus)
    try:
        metrics_server, _ = serve(exported, port=args.metrics_port, address=args.metrics_address)
    except OSError as error:
        raise _Refused(
            EXIT_USAGE, f"cannot serve /metrics on {args.metrics_address}:{args.metrics_port}: {error}"
        ) from None
    log.info("serving /metrics on %s:%d", args.metrics_address, args.metrics_port)
    return exported, metrics_server


def _sender(args):
    """What ships batches to the control plane, spooling those it cannot deliver."""
    from lockstep_agent.sender import Sender
    from lockstep_agent.spool import Spool

    try:
        spool = Spool(args.spool_dir)
    except OSError as error:
        raise _Refused(
            EXIT_USAGE, f"cannot use the spool directory {args.spool_dir}: {error} (see --spool-dir)"
        ) from None
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
    return sender


def _stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(signum, lambda *_: stop.set())
        except ValueError:  # not the main thread (tests calling main() from a thread)
            pass
    return stop


def _send_batches(args, sources: _Sources, sender, stop: threading.Event, count: int) -> None:
    """Collect and send (or print) one batch every interval until stopped or ``count`` batches are out."""
    sent = 0
    next_facility = 0.0
    while not stop.is_set():
        started = time.monotonic()
        facility_points = []
        if sources.facility is not None and started >= next_facility:
            facility_points = sources.facility.collect()
            next_facility = started + args.facility_interval
        batch = _collect(args, sources, facility_points)
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
            if sources.gpus is not None:
                sources.gpus.wait_for_events(step)  # Xids arrive while we wait
            else:
                stop.wait(step)
            remaining = args.interval - (time.monotonic() - started)


def _collect(args, sources: _Sources, facility_points: list) -> dict:
    """One batch: the GPU readings and events, the NICs and the facility points collected this time."""
    gpus = sources.gpus
    readings = gpus.collect() if gpus else []
    if sources.exported is not None:
        sources.exported.update(readings)
    return make_batch(
        node=args.node,
        gpu_status=sources.gpu_status,
        gpu_status_reason=sources.gpu_reason,
        driver_version=gpus.driver_version if gpus else None,
        readings=readings,
        events=gpus.take_events() if gpus else [],
        nics=sources.nics.collect(),
        facility=facility_points,
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
