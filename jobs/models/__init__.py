from jobs.models.actions import NodeEscalation, RecoveryAction, RecoveryEstimate, SpareBooking
from jobs.models.faults import FaultEvent
from jobs.models.incidents import Incident
from jobs.models.jobs import Job, JobAllocation, JobPhase, JobProgress, JobSnapshot, JobToken

__all__ = [
    "FaultEvent", "Incident", "Job", "JobAllocation", "JobPhase", "JobProgress", "JobSnapshot", "JobToken", "NodeEscalation",
    "RecoveryAction", "RecoveryEstimate", "SpareBooking",
]
