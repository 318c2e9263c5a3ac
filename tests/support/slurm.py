"""Small steps on the test Slurm (``jobs.local_slurm.cluster.SlurmCluster``): submitting a job, waiting on it."""

import time


def wait(predicate, timeout: float = 30, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def sbatch(slurm, *args: str) -> str:
    return slurm.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]
