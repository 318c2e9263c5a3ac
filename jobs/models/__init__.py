from jobs.models.actions import NodeEscalation, RecoveryAction, RecoveryEstimate, SpareBooking
from jobs.models.faults import FaultEvent
from jobs.models.incidents import Incident
from jobs.models.jobs import Job, JobAllocation, JobPhase, JobProgress, JobSnapshot, JobStandby, JobToken
from jobs.models.launchers import LauncherCredential, SlurmJob

__all__ = [
    "FaultEvent",
    "Incident",
    "Job",
    "JobAllocation",
    "JobPhase",
    "JobProgress",
    "JobSnapshot",
    "JobStandby",
    "JobToken",
    "LauncherCredential",
    "NodeEscalation",
    "RecoveryAction",
    "RecoveryEstimate",
    "SlurmJob",
    "SpareBooking",
]
