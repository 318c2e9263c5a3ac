"""Sending work to the workers once a change is stored."""

import logging

log = logging.getLogger(__name__)


def queue(task, *args) -> bool:
    """Send ``task(*args)`` to the workers; returns whether the broker took it.

    Work is queued for a change already stored (after COMMIT), so a broker that is away is logged, not raised: the
    request or task that made the change must not answer as failed (an API client would retry what was stored).
    What the message would have started, a beat sweep finds: new faults (``jobs.fault_sweep``), running rollouts
    (``fleet.rollout_sweep``), clusters off their blueprint (``fleet.drift_sweep``), queued what-ifs
    (``simulator.whatif_sweep``)."""
    try:
        task.delay(*args)
    except (
        Exception
    ) as error:  # kombu's OperationalError, a timeout, a refused connection: the broker is away
        log.warning(
            "could not queue %s%s (%r); the change is stored and its beat sweep picks the work up",
            task.name,
            tuple(args),
            error,
        )
        return False
    return True
