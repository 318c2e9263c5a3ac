from fleet.models.blueprints import Blueprint, BlueprintVersion
from fleet.models.hardware import GPU, NIC, Cluster, Fleet, Node
from fleet.models.observed import ObservedAddon, SimulatedAddon, SimulatedOperation

__all__ = [
    "GPU", "NIC", "Blueprint", "BlueprintVersion", "Cluster", "Fleet", "Node", "ObservedAddon",
    "SimulatedAddon", "SimulatedOperation",
]
