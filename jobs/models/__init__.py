from jobs.models.actions import NodeEscalation, RecoveryAction, SpareBooking
from jobs.models.faults import FaultEvent
from jobs.models.jobs import Job, JobAllocation, JobPhase, JobProgress, JobSnapshot, JobToken

__all__ = [
    "FaultEvent", "Job", "JobAllocation", "JobPhase", "JobProgress", "JobSnapshot", "JobToken", "NodeEscalation",
    "RecoveryAction", "SpareBooking",
]
