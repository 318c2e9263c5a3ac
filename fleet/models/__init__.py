from fleet.models.blueprints import Blueprint, BlueprintVersion
from fleet.models.drift import DriftFinding
from fleet.models.hardware import GPU, NIC, AutomationSwitch, Cluster, Fleet, Node
from fleet.models.observed import ObservedAddon, SimulatedAddon, SimulatedOperation
from fleet.models.overlays import ValuesOverlay
from fleet.models.rollouts import Rollout, RolloutBatch, RolloutCluster
from fleet.models.sources import BlueprintSource, SourceCommit

__all__ = [
    "GPU",
    "NIC",
    "AutomationSwitch",
    "Blueprint",
    "BlueprintSource",
    "BlueprintVersion",
    "Cluster",
    "DriftFinding",
    "Fleet",
    "Node",
    "ObservedAddon",
    "Rollout",
    "RolloutBatch",
    "RolloutCluster",
    "SimulatedAddon",
    "SimulatedOperation",
    "SourceCommit",
    "ValuesOverlay",
]
