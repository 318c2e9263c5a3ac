"""The Kubernetes driver: node operations through the official ``kubernetes`` client, Helm releases through the
``helm`` CLI.

- cordon / uncordon: PATCH the node's ``spec.unschedulable``;
- taint: read the node, PATCH ``spec.taints`` with the new taint added;
- drain: cordon, then evict every pod on the node through the Eviction API (DaemonSet and mirror pods excepted),
  so PodDisruptionBudgets are respected: a 429 from the API means a budget refused, and the drain reports it as a
  transient error for the caller to retry; pods are never deleted directly;
- add-ons: ``helm upgrade --install`` (values on standard input), ``helm uninstall``, and ``helm list`` plus
  ``helm get values`` to observe; node software is observed from the ``lockstep.io/node-software.<component>``
  labels the node agent writes;
- stuck releases: a release left ``pending-install``/``pending-upgrade``/``pending-rollback`` (a crashed upgrade)
  blocks every later upgrade ("another operation (install/upgrade/rollback) is in progress"). Past the pending
  deadline (``pending_deadline_seconds``, default HELM_PENDING_DEADLINE_SECONDS) it is observed as Degraded with
  Helm's own description from ``helm history``, and the next apply recovers it: ``helm rollback`` to the last
  good revision (``helm uninstall`` for a first install that never finished), then the upgrade again;
- health_check: not supported, and declared so (the base class refuses it): a check pod per GPU model and image is
  not built yet, so a repaired node on a Kubernetes cluster waits on the escalation ladder for a human.

Connection settings (``Cluster.connection``): ``kubeconfig`` (a path) and ``context``, or ``in_cluster: true``;
``helm`` (the binary, default ``helm``) and ``timeout_seconds`` (default 120). The API client and the command
runner can be injected (tests do: neither a live cluster nor the helm binary exists where Lockstep is tested).
"""

import json
import logging
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

from controlplane.outbound import OutboundRefused, check_url
from fleet.choices import HealthStatus
from fleet.drivers.base import ClusterDriver, DriverError, ObservedState, Operation, OperationResult
from fleet.specs import NODE_SOFTWARE, NODE_SOFTWARE_PREFIX, REPO_SCHEMES, SEMVER

log = logging.getLogger(__name__)

NODE_SOFTWARE_LABEL = "lockstep.io/node-software."
HELM_HEALTH = {
    "deployed": HealthStatus.HEALTHY,
    "failed": HealthStatus.DEGRADED,
    "pending-install": HealthStatus.PROGRESSING,
    "pending-upgrade": HealthStatus.PROGRESSING,
    "pending-rollback": HealthStatus.PROGRESSING,
    "uninstalling": HealthStatus.PROGRESSING,
    "superseded": HealthStatus.UNKNOWN,
    "unknown": HealthStatus.UNKNOWN,
}


PENDING = ("pending-install", "pending-upgrade", "pending-rollback")
GOOD = ("deployed", "superseded")
IN_PROGRESS = "another operation (install/upgrade/rollback) is in progress"
# helm list writes "2024-05-01 10:00:00.123456789 +0000 UTC", helm history "2024-05-01T10:00:00.123456789Z".
HELM_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.\d+)?\s*(Z|[+-]\d{2}:?\d{2})?")


def helm_time(text) -> datetime | None:
    """When Helm says a release was updated (either format), or None if it cannot be read."""
    found = HELM_TIME.match(str(text or "").strip())
    if not found:
        return None
    day, clock, zone = found.groups()
    offset = timedelta(0)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
    return datetime.fromisoformat(f"{day}T{clock}").replace(tzinfo=timezone(offset)).astimezone(UTC)


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[list[str], str | None, float], CommandResult]


def run_command(args: list[str], stdin: str | None, timeout: float) -> CommandResult:
    """Run a command (helm) and capture its output; the real runner."""
    if shutil.which(args[0]) is None:
        raise DriverError(f"{args[0]} is not installed on this host")
    try:
        done = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as error:
        raise DriverError(f"{args[0]} timed out after {timeout}s", transient=True) from error
    return CommandResult(done.returncode, done.stdout, done.stderr)


def _core_api(connection: dict):
    """A CoreV1Api for the cluster, from its kubeconfig and context (or the in-cluster service account).

    Every request it makes gives up after one retry and ``timeout_seconds`` (connecting: at most 10 s), so an
    API server that does not answer costs its own cluster's caller seconds, not the drift sweep's whole time limit.
    A kubeconfig that cannot be loaded is a DriverError naming no path or content (the log has the details)."""
    import urllib3
    from kubernetes import client, config

    try:
        if connection.get("in_cluster"):
            config.load_incluster_config()
            api_client = client.ApiClient()
        elif not connection.get("kubeconfig"):
            raise DriverError("the cluster has no kubeconfig in its connection settings")
        else:
            api_client = config.new_client_from_config(
                config_file=connection["kubeconfig"], context=connection.get("context")
            )
    except (config.ConfigException, OSError, ValueError, TypeError) as error:
        log.warning("kubeconfig of a Kubernetes cluster not loaded: %s: %s", type(error).__name__, error)
        raise DriverError(
            f"the cluster's Kubernetes configuration cannot be loaded ({type(error).__name__})"
        ) from error
    timeout = float(connection.get("timeout_seconds", 120))
    api_client.rest_client.pool_manager.connection_pool_kw.update(
        retries=urllib3.Retry(total=1, redirect=0),
        timeout=urllib3.Timeout(connect=min(timeout, 10.0), read=timeout),
    )
    return client.CoreV1Api(api_client)


def unreachable(what: str, error: Exception) -> DriverError:
    """The DriverError for a request that got no answer from the API server (refused, timed out, TLS failed)."""
    reason = getattr(error, "reason", None) or error
    detail = str(reason).rsplit(": ", 1)[-1][:200] or type(error).__name__
    return DriverError(f"{what}: the Kubernetes API server cannot be reached ({detail})", transient=True)


def split_chart(chart_field: str) -> tuple[str, str]:
    """``gpu-operator-v24.9.0`` → (``gpu-operator``, ``v24.9.0``): helm list joins name and version with a dash."""
    for i, char in enumerate(chart_field):
        if char == "-" and SEMVER.match(chart_field[i + 1 :]):
            return chart_field[:i], chart_field[i + 1 :]
    return chart_field, ""


class KubernetesDriver(ClusterDriver):
    name = "kubernetes"
    supports = frozenset(
        {
            Operation.APPLY_ADDON,
            Operation.REMOVE_ADDON,
            Operation.OBSERVE_ADDONS,
            Operation.CORDON,
            Operation.UNCORDON,
            Operation.DRAIN,
            Operation.TAINT,
        }
    )
    # Replaced in tests (there is no live cluster and no helm binary where Lockstep is tested).
    core_api_factory: Callable = staticmethod(_core_api)
    runner: Runner = staticmethod(run_command)

    def __init__(self, cluster, *, core_api=None, runner: Runner | None = None):
        super().__init__(cluster)
        self._core = core_api
        self._runner = runner

    @property
    def connection(self) -> dict:
        return self.cluster.connection or {}

    @property
    def core(self):
        if self._core is None:
            self._core = type(self).core_api_factory(self.connection)
        return self._core

    # --- helm -----------------------------------------------------------------------------------------------
    def _helm(self, *args: str, stdin: str | None = None) -> CommandResult:
        command = [self.connection.get("helm", "helm"), *args]
        if self.connection.get("kubeconfig"):
            command += ["--kubeconfig", self.connection["kubeconfig"]]
        if self.connection.get("context"):
            command += ["--kube-context", self.connection["context"]]
        runner = self._runner or type(self).runner
        return runner(command, stdin, float(self.connection.get("timeout_seconds", 120)))

    def pending_deadline(self) -> timedelta:
        from django.conf import settings

        seconds = self.connection.get("pending_deadline_seconds", settings.HELM_PENDING_DEADLINE_SECONDS)
        return timedelta(seconds=float(seconds))

    def _stuck_since(self, status: str, updated) -> datetime | None:
        """When a pending release started, if it has been pending longer than the deadline."""
        from django.utils import timezone as django_timezone

        when = helm_time(updated)
        if status not in PENDING or when is None:
            return None
        return when if django_timezone.now() - when > self.pending_deadline() else None

    def _history(self, name: str, namespace: str) -> list[dict]:
        result = self._helm("history", name, "--namespace", namespace, "--max", "10", "--output", "json")
        if result.returncode != 0:
            return []
        try:
            history = json.loads(result.stdout or "[]")
        except ValueError:
            return []
        return sorted((h for h in history if isinstance(h, dict)), key=lambda h: h.get("revision", 0))

    def _recover(self, name: str, namespace: str) -> str | None:
        """Recover a release stuck pending past the deadline: roll back to its last good revision, or uninstall a
        first install that never finished. Returns what was done, or None when it is not stuck (yet)."""
        history = self._history(name, namespace)
        if not history:
            return None
        newest = history[-1]
        status = newest.get("status", "")
        if self._stuck_since(status, newest.get("updated")) is None:
            return None
        good = [h for h in history[:-1] if h.get("status") in GOOD]
        if good:
            revision = str(good[-1]["revision"])
            self._check(
                self._helm("rollback", name, revision, "--namespace", namespace),
                f"helm rollback {name} {revision}",
            )
            return f"rolled back {status} revision {newest.get('revision')} to revision {revision}"
        self._check(self._helm("uninstall", name, "--namespace", namespace), f"helm uninstall {name}")
        return f"uninstalled the unfinished first install ({status})"

    def _check(self, result: CommandResult, what: str) -> CommandResult:
        if result.returncode != 0:
            message = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["failed"]
            transient = any(
                s in result.stderr for s in ("timeout", "connection refused", "i/o timeout", "EOF")
            )
            raise DriverError(f"{what}: {message[0]}", transient=transient)
        return result

    def apply_addon(self, addon: dict) -> OperationResult:
        if addon["name"].startswith(NODE_SOFTWARE_PREFIX):
            # Node software is installed by the node's own tooling once drained; the label records it.
            return OperationResult(handle=f"node-software:{addon['name']}", detail="recorded")
        repo, chart = addon.get("repo", ""), addon["chart"]
        if repo:
            # Checked again before helm fetches it: the name may resolve inside the installation by now. Helm
            # resolves it itself, so this is not pinned (docs/security.md, Outbound URLs); a name that does not
            # resolve is helm's to report.
            try:
                check_url(repo, schemes=REPO_SCHEMES, unresolved_ok=True)
            except OutboundRefused as refusal:
                raise DriverError(f"helm upgrade {addon['name']}: repository refused: {refusal}") from None
        args = ["upgrade", "--install", addon["name"]]
        if repo.startswith("oci://"):
            args += [f"{repo.rstrip('/')}/{chart}"]
        else:
            args += [chart] + (["--repo", repo] if repo else [])
        namespace = addon.get("namespace") or "default"
        args += [
            "--version",
            str(addon["version"]),
            "--namespace",
            namespace,
            "--create-namespace",
            "--values",
            "-",
            "--output",
            "json",
        ]
        values = json.dumps(addon.get("values") or {})
        result = self._helm(*args, stdin=values)
        recovered = None
        if result.returncode != 0 and IN_PROGRESS in result.stderr:
            # A release stuck pending blocks every upgrade; past the deadline it is rolled back and tried again.
            recovered = self._recover(addon["name"], namespace)
            if recovered is None:
                message = result.stderr.strip().splitlines()[-1]
                raise DriverError(f"helm upgrade {addon['name']}: {message} (waiting)", transient=True)
            log.warning("helm release %s/%s was stuck: %s", namespace, addon["name"], recovered)
            result = self._helm(*args, stdin=values)
        self._check(result, f"helm upgrade {addon['name']}")
        detail = "helm upgrade --install" + (f" after it {recovered}" if recovered else "")
        return OperationResult(handle=f"helm:{namespace}/{addon['name']}", detail=detail)

    def remove_addon(self, name: str, namespace: str = "") -> OperationResult:
        if name.startswith(NODE_SOFTWARE_PREFIX):
            return OperationResult(handle=f"node-software:{name}")
        result = self._helm("uninstall", name, "--namespace", namespace or "default")
        if result.returncode != 0 and "not found" not in result.stderr:
            self._check(result, f"helm uninstall {name}")
        return OperationResult(handle=f"helm:{namespace or 'default'}/{name}", detail="helm uninstall")

    def observe_addons(self) -> list[ObservedState]:
        releases = json.loads(
            self._check(self._helm("list", "--all-namespaces", "--output", "json"), "helm list").stdout
            or "[]"
        )
        found = []
        for release in releases:
            name, namespace = release["name"], release.get("namespace", "")
            values = self._check(
                self._helm("get", "values", name, "--namespace", namespace, "--output", "json"),
                f"helm get values {name}",
            )
            chart, version = split_chart(release.get("chart", ""))
            status = release.get("status", "unknown")
            health, message = HELM_HEALTH.get(status, HealthStatus.UNKNOWN), ""
            stuck = self._stuck_since(status, release.get("updated"))
            if stuck is not None or status == "failed":
                health = HealthStatus.DEGRADED
                said = next((h.get("description", "") for h in reversed(self._history(name, namespace))), "")
                message = (
                    f"{status} since {stuck:%Y-%m-%d %H:%M:%S} UTC, past the pending deadline"
                    + (f": {said}" if said else "")
                    if stuck is not None
                    else f"failed: {said}"
                    if said
                    else "failed"
                )[:500]
            found.append(
                ObservedState(
                    name=name,
                    chart=chart,
                    version=version,
                    namespace=namespace,
                    values=json.loads(values.stdout or "null") or {},
                    health=health,
                    message=message,
                )
            )
        return found + self._observe_node_software()

    def _observe_node_software(self) -> list[ObservedState]:
        """A component's version when every node reports the same; "mixed" (Progressing) while a roll is under way."""
        nodes = self._call(lambda: self.core.list_node().items, "list nodes")
        seen: dict[str, set[str]] = {}
        for node in nodes:
            labels = getattr(node.metadata, "labels", None) or {}
            for component in NODE_SOFTWARE:
                if NODE_SOFTWARE_LABEL + component in labels:
                    seen.setdefault(component, set()).add(labels[NODE_SOFTWARE_LABEL + component])
        out = []
        for component, versions in sorted(seen.items()):
            single = len(versions) == 1
            out.append(
                ObservedState(
                    name=NODE_SOFTWARE_PREFIX + component,
                    version=versions.pop() if single else "mixed",
                    health=HealthStatus.HEALTHY if single else HealthStatus.PROGRESSING,
                )
            )
        return out

    # --- nodes ----------------------------------------------------------------------------------------------
    def _call(self, call, what: str):
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call()
        except ApiException as error:
            raise DriverError(
                f"{what}: {error.status} {error.reason}", transient=error.status in (429, 500, 502, 503, 504)
            ) from error
        except (HTTPError, OSError) as error:
            raise unreachable(what, error) from error

    def cordon(self, node) -> OperationResult:
        self._call(lambda: self.core.patch_node(node.hostname, {"spec": {"unschedulable": True}}), "cordon")
        return OperationResult(handle=f"node:{node.hostname}", detail="cordoned")

    def uncordon(self, node) -> OperationResult:
        self._call(
            lambda: self.core.patch_node(node.hostname, {"spec": {"unschedulable": False}}), "uncordon"
        )
        return OperationResult(handle=f"node:{node.hostname}", detail="uncordoned")

    def taint(self, node, key: str, value: str, effect: str) -> OperationResult:
        current = self._call(lambda: self.core.read_node(node.hostname), "read node")
        taints = [
            {"key": t.key, "value": t.value, "effect": t.effect}
            for t in (getattr(current.spec, "taints", None) or [])
        ]
        wanted = {"key": key, "value": value, "effect": effect}
        taints = [t for t in taints if (t["key"], t["effect"]) != (key, effect)] + [wanted]
        self._call(lambda: self.core.patch_node(node.hostname, {"spec": {"taints": taints}}), "taint")
        return OperationResult(handle=f"node:{node.hostname}", detail=f"tainted {key}={value}:{effect}")

    def _evictable(self, hostname: str) -> list:
        pods = self._call(
            lambda: self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={hostname}"),
            "list pods",
        ).items
        keep = []
        for pod in pods:
            meta = pod.metadata
            if any(owner.kind == "DaemonSet" for owner in (meta.owner_references or [])):
                continue
            if "kubernetes.io/config.mirror" in (meta.annotations or {}):
                continue
            if getattr(pod.status, "phase", None) in ("Succeeded", "Failed"):
                continue
            keep.append(pod)
        return keep

    def drain(self, node) -> OperationResult:
        """Cordon, then ask the Eviction API to evict each pod; PodDisruptionBudgets decide (429 = not now)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        self.cordon(node)
        refused = []
        for pod in self._evictable(node.hostname):
            name, namespace = pod.metadata.name, pod.metadata.namespace
            body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
            try:
                self.core.create_namespaced_pod_eviction(name=name, namespace=namespace, body=body)
            except ApiException as error:
                if error.status == 404:
                    continue  # already gone
                if error.status == 429:
                    refused.append(f"{namespace}/{name}")
                    continue
                raise DriverError(
                    f"evict {namespace}/{name}: {error.status} {error.reason}", transient=error.status >= 500
                ) from error
            except (HTTPError, OSError) as error:
                raise unreachable(f"evict {namespace}/{name}", error) from error
        if refused:
            raise DriverError(
                f"a PodDisruptionBudget refused evicting {', '.join(refused)}; retry later", transient=True
            )
        return OperationResult(handle=f"drain:{node.hostname}", detail="evictions requested")

    def drain_done(self, node) -> bool:
        return not self._evictable(node.hostname)

    def operation_status(self, handle: str) -> str:
        kind, _, target = handle.partition(":")
        if kind == "drain":
            return "succeeded" if not self._evictable(target) else "running"
        if kind == "helm":
            namespace, _, name = target.partition("/")
            result = self._helm("status", name, "--namespace", namespace, "--output", "json")
            if result.returncode != 0:
                return "failed"
            status = json.loads(result.stdout).get("info", {}).get("status", "unknown")
            health = HELM_HEALTH.get(status, HealthStatus.UNKNOWN)
            return {HealthStatus.HEALTHY: "succeeded", HealthStatus.PROGRESSING: "running"}.get(
                health, "failed"
            )
        return "succeeded"
