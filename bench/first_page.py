"""First page after login on a cold browser cache, in a real browser (issue 47, part 6).

    .venv/bin/python bench/first_page.py [--runs 5] [--settle 30] [--production] [--no-collectstatic] [--web-only]

What runs: a scratch PostgreSQL database (lockstep_bench_first_page, dropped and created afresh) holding the demo
world (``simulator.world.world_build()``: the fleet `make run` shows), Redis DB 12 (flushed; BENCH_REDIS_URL), and
`make run`'s processes as the Procfile starts them, each a subprocess: uvicorn, the two Celery workers, beat and
the simulator (``--web-only``: uvicorn alone), with ``DEBUG=true`` (``--production``: DEBUG off, as the image
runs), after `manage.py collectstatic` as `make run` runs it, into a scratch STATIC_ROOT
(controlplane.testing.collected_static; ``--no-collectstatic`` skips it: how `make run` started before issue 47).
After ``--settle`` seconds of the demo running (faults,
recoveries, the simulated jobs' progress reports), Debian's Chromium (headless, through Playwright) logs in as a
provider admin, then, ``--runs`` times: clears the browser's cache (CDP ``Network.clearBrowserCache``; the
session cookie stays), loads ``/`` and waits until the page's load event and until Plotly has drawn the first
heat map.

Printed per run and as the median: time to the load event and to the first chart drawn (from navigation start),
and the bytes transferred (the navigation's and every resource's ``transferSize``: compressed bytes on the
wire, headers included), with the biggest resource; then the machine's load average before and after (the
machine is shared, so the number means little without it), measured over the loads.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratch import BASE, scratch_database  # noqa: E402

DB_NAME = "lockstep_bench_first_page"
PASSWORD = "bench-first-page-9"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
CHROMIUM = os.environ.get("LOCKSTEP_CHROMIUM", "/usr/bin/chromium")
# The load event, the first heat map drawn, and what went over the wire (performance entries of the page).
MEASURE = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const resources = performance.getEntriesByType("resource");
  const biggest = resources.reduce((a, r) => (r.transferSize > (a ? a.transferSize : -1) ? r : a), null);
  return {
    load: nav.loadEventEnd,
    bytes: nav.transferSize + resources.reduce((sum, r) => sum + r.transferSize, 0),
    decoded: nav.decodedBodySize + resources.reduce((sum, r) => sum + r.decodedBodySize, 0),
    requests: 1 + resources.length,
    biggest: biggest ? [biggest.name.split("/").pop(), biggest.transferSize, biggest.decodedBodySize] : null,
  };
}"""
CHART_DRAWN = "() => document.querySelector('.heatmap .main-svg') !== null"


def start(command: list[str], environment: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        cwd=BASE,
        env=environment,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def serve(scratch: Path, *, debug: bool, collect: bool, stack: bool) -> tuple[list[subprocess.Popen], str]:
    """`make run`'s processes (Procfile: web, worker, analytics, beat, simulator; ``stack`` off: web alone) on a
    free port, after collectstatic (unless ``collect`` is off). Returns them and the web's URL."""
    import requests

    from tests.support.processes import free_port, wait_for

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    venv = Path(sys.executable).parent
    environment = dict(
        os.environ,
        # Production's settings (on plain HTTP), and a scratch STATIC_ROOT where static files are collected.
        DJANGO_SETTINGS_MODULE="controlplane.testing.collected_static"
        if collect
        else "controlplane.settings",
        LOCKSTEP_STATIC_ROOT=str(scratch / "static"),
        DEBUG="true" if debug else "false",
        REDIS_URL=REDIS_URL,
        LOG_LEVEL="WARNING",
        LOCAL_ENV_FILE="",
        PYTHONUNBUFFERED="1",
        PATH=f"{venv}:{os.environ.get('PATH', '')}",
    )
    if collect:
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
            cwd=BASE,
            env=environment,
            check=True,
        )
        print(f"collectstatic: {time.monotonic() - started:.1f} s")
    celery = [str(venv / "celery"), "-A", "controlplane"]
    commands = {
        "web": [str(venv / "uvicorn"), "controlplane.asgi:application", "--host", "127.0.0.1"]
        + ["--port", str(port), "--log-level", "warning", "--no-access-log"],
        "worker": [*celery, "worker", "--loglevel=warning", "--concurrency=2", "-Q", "faults,celery"]
        + ["-n", f"faults-{port}@%h"],
        "analytics": [*celery, "worker", "--loglevel=warning", "--concurrency=1", "-Q", "analytics"]
        + ["-n", f"analytics-{port}@%h"],
        "beat": [*celery, "beat", "--loglevel=warning", "--schedule", str(scratch / "celerybeat-schedule")],
        "simulator": [
            "sh",
            "-c",
            f"python manage.py demo start --url {url} >/dev/null "
            f"&& exec python manage.py simulate run --url {url}",
        ],
    }
    names = list(commands) if stack else ["web"]
    processes = [start(commands[name], environment, scratch / f"{name}.log") for name in names]
    wait_for(lambda: requests.get(f"{url}/healthz", timeout=1).ok, 60, what=f"uvicorn (log: {scratch})")
    return processes, url


def measure(url: str, username: str, runs: int) -> list[dict]:
    from playwright.sync_api import sync_playwright

    from tests.support.browser import CHROMIUM_ARGS, log_in

    results = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 900})
            page = context.new_page()
            log_in(page, url, username, PASSWORD)
            cdp = context.new_cdp_session(page)
            cdp.send("Network.enable")
            for _ in range(runs):
                page.goto("about:blank")
                cdp.send("Network.clearBrowserCache")
                page.goto(f"{url}/", wait_until="load", timeout=60_000)
                page.wait_for_function(CHART_DRAWN, timeout=60_000)
                drawn = page.evaluate("() => performance.now()")
                result = page.evaluate(MEASURE)
                result["drawn"] = drawn
                results.append(result)
        finally:
            browser.close()
    return results


def report(results: list[dict]) -> None:
    for number, r in enumerate(results, 1):
        name, wire, decoded = r["biggest"]
        print(
            f"run {number}: load {r['load']:,.0f} ms, chart drawn {r['drawn']:,.0f} ms, "
            f"{r['bytes'] / 1e6:.2f} MB transferred ({r['decoded'] / 1e6:.2f} MB decoded) in {r['requests']} "
            f"requests; biggest {name} {wire / 1e6:.2f} MB ({decoded / 1e6:.2f} MB decoded)"
        )
    print(
        f"median: load {statistics.median(r['load'] for r in results):,.0f} ms, chart drawn "
        f"{statistics.median(r['drawn'] for r in results):,.0f} ms, "
        f"{statistics.median(r['bytes'] for r in results) / 1e6:.2f} MB transferred"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--production", action="store_true", help="DEBUG off, as the image runs")
    parser.add_argument("--web-only", action="store_true", help="start uvicorn alone, not the whole stack")
    parser.add_argument(
        "--settle", type=float, default=30, help="seconds the stack runs before the first load (default 30)"
    )
    parser.add_argument(
        "--no-collectstatic", action="store_true", help="serve without collecting static files first"
    )
    args = parser.parse_args()
    if not os.path.exists(CHROMIUM):
        sys.exit(f"{CHROMIUM} is missing: apt-get install chromium")
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    database = scratch_database(DB_NAME, LOG_LEVEL="WARNING")
    # Playwright's sync API runs an event loop in this thread; the ORM calls here are plain sync code.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from django.contrib.auth import get_user_model

    from simulator.world import SERVICE_USER, world_build
    from tests.support.browser import usable_password

    world_build()
    user = get_user_model().objects.get(username=SERVICE_USER)
    usable_password(user, PASSWORD)
    os.environ["DATABASE_URL"] = database
    from tests.support.processes import stop_group

    with tempfile.TemporaryDirectory(prefix="lockstep-first-page-") as scratch:
        processes, url = serve(
            Path(scratch),
            debug=not args.production,
            collect=not args.no_collectstatic,
            stack=not args.web_only,
        )
        try:
            if not args.web_only:
                time.sleep(args.settle)  # the demo under way: faults, recoveries, progress reports
            load_before = os.getloadavg()
            results = measure(url, user.username, args.runs)
        finally:
            for process in processes:
                stop_group(process)
    print(
        f"settings: DEBUG {'off' if args.production else 'on'}, "
        f"{'no collectstatic' if args.no_collectstatic else 'collectstatic'}, "
        f"{'web alone' if args.web_only else 'the whole stack, ' + format(args.settle, '.0f') + ' s after start'}"
    )
    report(results)
    load_after = os.getloadavg()
    print(
        f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
        f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f} ({os.cpu_count()} CPUs)"
    )


if __name__ == "__main__":
    main()
