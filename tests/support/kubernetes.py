"""A fake of the Kubernetes core API for driver tests: it records every call, and its pods and node are real
``kubernetes.client`` models."""

import json

from kubernetes import client
from kubernetes.client.exceptions import ApiException


class FakeCore:
    """Records every call; pods and node are real kubernetes.client models."""

    def __init__(self, pods=(), refuse=(), taints=(), labels=None):
        self.calls, self.pods, self.refuse = [], list(pods), set(refuse)
        self.node = client.V1Node(
            metadata=client.V1ObjectMeta(name="gpu-1", labels=labels or {}),
            spec=client.V1NodeSpec(taints=[client.V1Taint(**t) for t in taints]),
        )

    def patch_node(self, name, body):
        self.calls.append(("patch_node", name, body))

    def read_node(self, name):
        self.calls.append(("read_node", name))
        return self.node

    def list_node(self):
        return client.V1NodeList(items=[self.node])

    def list_pod_for_all_namespaces(self, field_selector=None):
        self.calls.append(("list_pods", field_selector))
        return client.V1PodList(items=list(self.pods))

    def create_namespaced_pod_eviction(self, name, namespace, body):
        self.calls.append(("evict", namespace, name, body.metadata.name))
        if name in self.refuse:
            raise ApiException(status=429, reason="Too Many Requests")
        self.pods = [p for p in self.pods if p.metadata.name != name]


def pod(name, namespace="train", owner=None, phase="Running", mirror=False):
    owners = (
        [client.V1OwnerReference(api_version="apps/v1", kind=owner, name="x", uid="u")] if owner else None
    )
    annotations = {"kubernetes.io/config.mirror": "abc"} if mirror else None
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name, namespace=namespace, owner_references=owners, annotations=annotations
        ),
        status=client.V1PodStatus(phase=phase),
    )


class FakeHelmReleases:
    """A recording fake of the helm binary with releases that have revisions: ``upgrade --install``, ``rollback``,
    ``uninstall``, ``history``, ``list`` and ``get values`` answer as Helm 3 does, with its messages; a release
    made ``stuck`` stays pending, as a crashed upgrade leaves it, and refuses upgrades as Helm does."""

    IN_PROGRESS = "Error: UPGRADE FAILED: another operation (install/upgrade/rollback) is in progress"

    def __init__(self):
        self.commands, self.releases = [], {}

    def release(self, name, namespace, revisions):
        """``revisions``: [(status, chart, updated as helm history writes it, description)], oldest first."""
        self.releases[(namespace, name)] = [
            {"revision": i + 1, "status": s, "chart": c, "updated": u, "description": d}
            for i, (s, c, u, d) in enumerate(revisions)
        ]

    @staticmethod
    def _option(args, name, default=""):
        return args[args.index(name) + 1] if name in args else default

    def __call__(self, args, stdin, timeout):
        from fleet.drivers.kubernetes import CommandResult

        self.commands.append((args, stdin))
        verb, namespace = args[1], self._option(args, "--namespace", "default")
        if verb == "list":
            out = [
                {
                    "name": n,
                    "namespace": ns,
                    "revision": str(h[-1]["revision"]),
                    "chart": h[-1]["chart"],
                    "status": h[-1]["status"],
                    "updated": h[-1]["updated"].replace("T", " ").replace("Z", " +0000 UTC"),
                }
                for (ns, n), h in sorted(self.releases.items())
            ]
            return CommandResult(0, json.dumps(out), "")
        if verb == "get":
            return CommandResult(0, "{}", "")
        name = args[3] if verb == "upgrade" else args[2]
        history = self.releases.get((namespace, name))
        if verb == "history":
            if history is None:
                return CommandResult(1, "", "Error: release: not found")
            return CommandResult(0, json.dumps(history), "")
        if verb == "upgrade":
            if history and history[-1]["status"].startswith("pending-"):
                return CommandResult(1, "", self.IN_PROGRESS)
            for entry in history or []:
                entry["status"] = "superseded"
            chart = f"{args[4].rsplit('/', 1)[-1]}-{self._option(args, '--version')}"
            self.releases.setdefault((namespace, name), []).append(
                {
                    "revision": len(history or []) + 1,
                    "status": "deployed",
                    "chart": chart,
                    "updated": "2099-01-01T00:00:00Z",
                    "description": "Upgrade complete",
                }
            )
            return CommandResult(0, "{}", "")
        if verb == "rollback":
            target = int(args[3])
            good = next(h for h in history if h["revision"] == target)
            for entry in history:
                entry["status"] = "superseded"
            history.append(
                {
                    "revision": len(history) + 1,
                    "status": "deployed",
                    "chart": good["chart"],
                    "updated": "2099-01-01T00:00:00Z",
                    "description": f"Rollback to {target}",
                }
            )
            return CommandResult(0, "Rollback was a success! Happy Helming!\n", "")
        if verb == "uninstall":
            if history is None:
                return CommandResult(
                    1, "", f"Error: uninstall: Release not loaded: {name}: release: not found"
                )
            del self.releases[(namespace, name)]
            return CommandResult(0, f'release "{name}" uninstalled\n', "")
        return CommandResult(0, "{}", "")
