"""A real Prometheus and Alertmanager for tests and benches, from Debian's packages (``prometheus``,
``prometheus-alertmanager``), on free loopback ports in a folder of their own.

    with MonitoringStack(folder, lockstep_url=server.url, scrape_token=read_token, webhook_token=write_token,
                         gpu_targets=[("127.0.0.1:9400", "node-1")]) as stack:
        stack.query('DCGM_FI_DEV_XID_ERRORS')
        stack.alerts()

Both run the shipped configuration (deploy/prometheus/, deploy/alertmanager/), rewritten into the folder only where
a test must differ: its targets and ports, token files, and shorter intervals (``Timings``), so a rule fires within
seconds. Nothing templated is committed; ``variant_*`` say exactly what changes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml

from tests.support.processes import free_port, stop_group, wait_for

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
ALERTMANAGER_CONFIG = DEPLOY / "alertmanager" / "alertmanager.yml"
RULE_FILES = sorted((DEPLOY / "prometheus" / "rules").glob("*.rules.yml"))
RULE_TESTS = sorted((DEPLOY / "prometheus" / "rules" / "tests").glob("*.yml"))


def binary(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
        if found:
            return found
    return None


def binaries() -> dict[str, str | None]:
    """Debian names its Alertmanager ``prometheus-alertmanager``; upstream's tarball, ``alertmanager``."""
    return {
        "prometheus": binary("prometheus"),
        "alertmanager": binary("prometheus-alertmanager", "alertmanager"),
        "promtool": binary("promtool"),
        "amtool": binary("amtool"),
    }


def available() -> str:
    """Why a real Prometheus and Alertmanager cannot start here ('' when they can)."""
    missing = [name for name, path in binaries().items() if path is None]
    if missing:
        return (
            f"Prometheus tools missing ({', '.join(missing)}): apt-get install prometheus prometheus-alertmanager "
            "(.ci/run does)"
        )
    return ""


@dataclass
class Timings:
    """What a test shortens. The shipped values are in the files (and docs/benchmarks.md says why)."""

    scrape_interval: str = "1s"
    # Lockstep's /metrics reads the database: on a loaded test machine a 1 s timeout would fail scrapes (and a
    # failed scrape marks the target's series stale).
    lockstep_scrape_interval: str = "2s"
    evaluation_interval: str = "1s"
    group_wait: str = "1s"
    group_interval: str = "2s"
    # Durations inside rule expressions, e.g. the Xid rule's ten-minute window: {"10m": "20s"}.
    rule_windows: dict[str, str] = field(default_factory=dict)

    @classmethod
    def shipped(cls) -> Timings:
        """The intervals of the shipped files on the Xid's path: the GPU nodes' scrape interval, the rule
        evaluation interval, and the waits of Alertmanager's route to Lockstep."""
        prometheus = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
        gpu_nodes = next(job for job in prometheus["scrape_configs"] if job["job_name"] == "gpu-nodes")
        alertmanager = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
        route = next(r for r in alertmanager["route"]["routes"] if r["receiver"] == "lockstep")
        lockstep = next(job for job in prometheus["scrape_configs"] if job["job_name"] == "lockstep")
        return cls(
            scrape_interval=gpu_nodes["scrape_interval"],
            lockstep_scrape_interval=lockstep["scrape_interval"],
            evaluation_interval=prometheus["global"]["evaluation_interval"],
            group_wait=route["group_wait"],
            group_interval=route["group_interval"],
        )


def _seconds(duration: str) -> float:
    """A Prometheus duration of one unit ("500ms", "10s", "2m") in seconds."""
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration).groups()
    return float(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def variant_rules(source: Path, folder: Path, windows: dict[str, str]) -> Path:
    """A copy of a shipped rule file with the durations in ``windows`` replaced inside its expressions."""
    groups = yaml.safe_load(source.read_text())
    for group in groups["groups"]:
        for rule in group["rules"]:
            for old, new in windows.items():
                rule["expr"] = re.sub(rf"(?<![0-9a-z]){re.escape(old)}(?![0-9a-z])", new, rule["expr"])
    target = folder / source.name
    target.write_text(yaml.safe_dump(groups, sort_keys=False))
    return target


def variant_prometheus(
    folder: Path,
    *,
    lockstep_target: str,
    token_file: Path,
    gpu_targets: list[tuple[str, str]],
    alertmanager_target: str,
    prometheus_target: str,
    timings: Timings,
) -> Path:
    """The shipped prometheus.yml with this test's targets, token file, rule copies and intervals."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"]["scrape_interval"] = timings.scrape_interval
    config["global"]["evaluation_interval"] = timings.evaluation_interval
    config["global"]["scrape_timeout"] = min(timings.scrape_interval, "5s", key=_seconds)
    config["rule_files"] = [str(variant_rules(path, folder, timings.rule_windows)) for path in RULE_FILES]
    config["alerting"]["alertmanagers"][0]["static_configs"] = [{"targets": [alertmanager_target]}]
    targets = folder / "gpu-nodes.yml"
    targets.write_text(
        yaml.safe_dump([{"targets": [address], "labels": {"node": node}} for address, node in gpu_targets])
    )
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    lockstep, gpu_nodes = jobs["lockstep"], jobs["gpu-nodes"]
    lockstep["static_configs"] = [{"targets": [lockstep_target]}]
    jobs["alertmanager"]["static_configs"] = [{"targets": [alertmanager_target]}]
    jobs["prometheus"]["static_configs"] = [{"targets": [prometheus_target]}]
    lockstep["authorization"]["credentials_file"] = str(token_file)
    for job, interval in ((lockstep, timings.lockstep_scrape_interval), (gpu_nodes, timings.scrape_interval)):
        job["scrape_interval"] = interval
        job["scrape_timeout"] = min(interval, "5s", key=_seconds)
    gpu_nodes["file_sd_configs"] = [{"files": [str(targets)], "refresh_interval": "1s"}]
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def variant_alertmanager(folder: Path, *, webhook_url: str, token_file: Path, timings: Timings) -> Path:
    """The shipped alertmanager.yml posting to this test's Lockstep, with its token file and shorter waits."""
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    routes = [config["route"], *config["route"].get("routes", [])]
    for route in routes:
        route["group_wait"], route["group_interval"] = timings.group_wait, timings.group_interval
    receiver = next(r for r in config["receivers"] if r["name"] == "lockstep")
    webhook = receiver["webhook_configs"][0]
    webhook["url"] = webhook_url
    webhook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    path = folder / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def check(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)


class MonitoringStack:
    """Prometheus and Alertmanager, each in a session of its own, stopped when the context ends."""

    def __init__(
        self,
        folder: Path,
        *,
        lockstep_url: str,
        scrape_token: str,
        webhook_token: str,
        gpu_targets: list[tuple[str, str]],
        timings: Timings | None = None,
    ):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.timings = timings or Timings()
        self.lockstep_url = lockstep_url.rstrip("/")
        self.gpu_targets = gpu_targets
        self.prometheus_port, self.alertmanager_port = free_port(), free_port()
        self.scrape_token_file = self._secret("prometheus-token", scrape_token)
        self.webhook_token_file = self._secret("alertmanager-token", webhook_token)
        self.processes: dict[str, subprocess.Popen] = {}

    def _secret(self, name: str, value: str) -> Path:
        path = self.folder / name
        path.write_text(value)
        path.chmod(0o600)
        return path

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://127.0.0.1:{self.alertmanager_port}"

    def write_configs(self) -> tuple[Path, Path]:
        prometheus = variant_prometheus(
            self.folder,
            lockstep_target=self.lockstep_url.split("://", 1)[1],
            token_file=self.scrape_token_file,
            gpu_targets=self.gpu_targets,
            alertmanager_target=f"127.0.0.1:{self.alertmanager_port}",
            prometheus_target=f"127.0.0.1:{self.prometheus_port}",
            timings=self.timings,
        )
        alertmanager = variant_alertmanager(
            self.folder,
            webhook_url=f"{self.lockstep_url}/api/v1/ingest/alertmanager/",
            token_file=self.webhook_token_file,
            timings=self.timings,
        )
        return prometheus, alertmanager

    def _start(self, name: str, command: list[str]) -> None:
        log = (self.folder / f"{name}.log").open("w")
        self.processes[name] = subprocess.Popen(
            command, cwd=self.folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def output(self, name: str) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> MonitoringStack:
        why = available()
        if why:
            raise RuntimeError(why)
        tools = binaries()
        prometheus_config, alertmanager_config = self.write_configs()
        self._start(
            "alertmanager",
            [
                tools["alertmanager"],
                f"--config.file={alertmanager_config}",
                f"--storage.path={self.folder / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{self.alertmanager_port}",
                "--cluster.listen-address=",
                "--log.level=info",
            ],
        )
        self._start(
            "prometheus",
            [
                tools["prometheus"],
                f"--config.file={prometheus_config}",
                f"--storage.tsdb.path={self.folder / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=info",
            ],
        )
        for name, url in (("alertmanager", self.alertmanager_url), ("prometheus", self.prometheus_url)):
            wait_for(
                lambda url=url: requests.get(f"{url}/-/ready", timeout=5).ok,
                30,
                what=f"{name} ({self.output(name)[-800:]})",
            )
        return self

    def stop(self) -> None:
        for process in self.processes.values():
            stop_group(process, 10)
        self.processes.clear()

    def __enter__(self) -> MonitoringStack:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- Prometheus's and Alertmanager's HTTP APIs -------------------------------------------------------------

    def _api(self, url: str, **params):
        response = requests.get(url, params=params, timeout=10)
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise RuntimeError(f"{url} {params}: {response.status_code} {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's result (a list of {metric, value}); raises on a PromQL error."""
        data = self._api(f"{self.prometheus_url}/api/v1/query", query=expr)
        return (
            data["result"]
            if data["resultType"] in ("vector", "matrix")
            else [{"metric": {}, "value": data["result"]}]
        )

    def targets(self) -> list[dict]:
        return self._api(f"{self.prometheus_url}/api/v1/targets")["activeTargets"]

    def rules(self) -> list[dict]:
        return [
            rule
            for group in self._api(f"{self.prometheus_url}/api/v1/rules")["groups"]
            for rule in group["rules"]
        ]

    def alerts(self) -> list[dict]:
        """Prometheus's active alerts (pending and firing)."""
        return self._api(f"{self.prometheus_url}/api/v1/alerts")["alerts"]

    def alertmanager_alerts(self) -> list[dict]:
        response = requests.get(f"{self.alertmanager_url}/api/v2/alerts", timeout=10)
        response.raise_for_status()
        return response.json()
