"""The event outbox under a steady stream of events: what publishing and relaying costs per event, and how long
the outbox sweep (beat, every few seconds) and the metrics' outbox gauge (every scrape) take to find the unsent
events as the relayed ones pile up between two autovacuums.

It builds a scratch database with ``--history`` events already relayed (a retention period's worth, VACUUMed, as
a fleet in service has them), then for ``--seconds`` publishes events as a decision does (one ``publish_many``
of ``--per-transaction`` events to four topics, committed, relayed and marked sent after commit) and, every
``--every`` seconds, times ``outbox_sweep`` and the gauge's read (median of five each). Autovacuum runs with the
server's settings, as in service. Run:

    .venv/bin/python bench/outbox.py                      # 1,000,000 events of history, 150 s of publishing
    .venv/bin/python bench/outbox.py --history 0 --seconds 30
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fault_path_profile import backend_cpu  # noqa: E402
from scratch import scratch_database  # noqa: E402

DB_NAME = os.environ.get("BENCH_DATABASE_NAME", "lockstep_bench_outbox")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
TOPICS = ["fleet", "cluster-1", "tenant-1", "job-{n}"]


def wal_lsn() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def fill_history(count: int) -> None:
    """``count`` events relayed long ago, written by SQL in one statement."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO controlplane_event (topic, seq, kind, payload, url, created_at, sent_at) "
            "SELECT 'history-' || (g %% 1000), g / 1000 + 1, 'job.progress', '{\"iteration\": 1}'::jsonb, '', "
            "now() - interval '1 day', now() FROM generate_series(0, %s - 1) AS g",
            [count],
        )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE controlplane_event")


def timed(call, times: int = 5) -> float:
    spent = []
    for _ in range(times):
        start = time.perf_counter()
        call()
        spent.append(1000 * (time.perf_counter() - start))
    return statistics.median(spent)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--history", type=int, default=1_000_000, help="events already relayed")
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--every", type=float, default=15.0, help="seconds between timings of the reads")
    parser.add_argument(
        "--per-transaction", type=int, default=2, help="events (of four topics each) a commit"
    )
    args = parser.parse_args()

    scratch_database(DB_NAME, REDIS_URL=REDIS_URL, LOG_LEVEL="WARNING")
    from django.db import connection, transaction

    from controlplane import events
    from controlplane.metrics import outbox_backlog

    started = time.perf_counter()
    fill_history(args.history)
    print(
        f"history: {args.history:,} relayed events written and vacuumed in {time.perf_counter() - started:.1f} s"
    )
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum_naptime")
        naptime = cursor.fetchone()[0]
    print(f"autovacuum as the server has it (naptime {naptime})")

    published = 0
    spent = [0, 0.0, 0.0]  # WAL bytes, CPU seconds here, CPU seconds of the backend, while publishing
    print(f"{'elapsed':>8} {'events':>9} {'sweep ms':>9} {'gauge ms':>9}")

    def report(elapsed: float) -> None:
        sweep = timed(lambda: events.outbox_sweep(min_age_seconds=0))
        read = timed(outbox_backlog)
        print(f"{elapsed:8.0f} {published:9,} {sweep:9.2f} {read:9.2f}", flush=True)

    def counters() -> tuple[int, float, float]:
        return wal_lsn(), time.process_time(), backend_cpu()

    def add_since(start: tuple[int, float, float]) -> None:
        for i, (now, then) in enumerate(zip(counters(), start, strict=True)):
            spent[i] += now - then

    report(0.0)
    begin = next_report = time.perf_counter()
    next_report += args.every
    n = 0
    start = counters()
    while (now := time.perf_counter()) - begin < args.seconds:
        if now >= next_report:  # the reads are timed outside the publishing's counters
            add_since(start)
            report(now - begin)
            next_report += args.every
            start = counters()
        with transaction.atomic():
            items = []
            for _ in range(args.per_transaction):
                n += 1
                topics = [name.format(n=n % 500) for name in TOPICS]
                items.append((topics, "job.progress", {"iteration": n}, ""))
            events.publish_many(items)
        published += len(TOPICS) * args.per_transaction
    add_since(start)
    wal, cpu_here, cpu_backend = spent
    report(time.perf_counter() - begin)
    print(
        f"publish and relay: {1000 * cpu_here / published:.3f} ms CPU per event here, "
        f"{1000 * cpu_backend / published:.3f} ms in PostgreSQL, {wal / published:.0f} WAL bytes per event "
        f"({published:,} events, {len(TOPICS) * args.per_transaction} a commit)"
    )


if __name__ == "__main__":
    main()
