"""The Kubernetes driver (built out by the blueprints work): node operations and Helm releases."""

from fleet.drivers.base import ClusterDriver


class KubernetesDriver(ClusterDriver):
    name = "kubernetes"
    supports = frozenset()
