"""Cluster drivers: one interface for what the control plane does to a cluster (see base.py)."""

from fleet.drivers.base import (
    ClusterDriver,
    DriverError,
    ObservedState,
    Operation,
    OperationResult,
    driver_for,
)

__all__ = ["ClusterDriver", "DriverError", "ObservedState", "Operation", "OperationResult", "driver_for"]
