"""The protection runtime: in-memory snapshots of a training job, replicated to a peer node, restored on relaunch.

    from lockstep_agent.protect import Protection
    protect = Protection(model, optimizer, every=1)          # restores, when there is something to restore
    for iteration in range(protect.start_iteration + 1, total + 1):
        ...                                                  # forward, backward, optimizer.step()
        protect.step(iteration)

Imports torch at import time: without torch this import fails plainly. docs/protection-runtime.md says what it
keeps, where, what it costs and what it cannot survive.
"""

import torch  # noqa: F401  (fail here, plainly, when torch is missing)

from lockstep_agent.protect.runtime import HangReport, Protection, RestoreResult

__all__ = ["HangReport", "Protection", "RestoreResult"]
