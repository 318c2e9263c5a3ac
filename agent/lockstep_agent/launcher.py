"""Register a job a scheduler started with Lockstep, and get the job token its progress reports use.

    from lockstep_agent.launcher import register_slurm_job
    job_id, job_token = register_slurm_job()      # in the job, rank 0, before training starts

Configuration from the environment: ``LOCKSTEP_URL`` and ``LOCKSTEP_LAUNCHER_TOKEN`` (an ``lsl_…`` launcher
credential bound to the job's cluster); the job is named by ``SLURM_JOB_ID``, which Slurm sets. A requeued job
registers again and gets a new token for the same Lockstep job. While Lockstep is still finishing the recovery
that requeued it, the answer is 409 and this waits (up to ``wait_seconds``) so the job's first progress report
after a restart counts from its checkpoint.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request


class RegistrationError(RuntimeError):
    pass


def register_slurm_job(
    *,
    url: str | None = None,
    token: str | None = None,
    slurm_job_id: str | None = None,
    wait_seconds: float = 120.0,
    timeout: float = 10.0,
) -> tuple[int, str]:
    """POST /api/v1/launchers/register/; returns (Lockstep job id, job token)."""
    url = (url or os.environ.get("LOCKSTEP_URL", "")).rstrip("/")
    token = token or os.environ.get("LOCKSTEP_LAUNCHER_TOKEN", "")
    slurm_job_id = slurm_job_id or os.environ.get("SLURM_JOB_ID", "")
    if not (url and token and slurm_job_id):
        raise RegistrationError("LOCKSTEP_URL, LOCKSTEP_LAUNCHER_TOKEN and SLURM_JOB_ID are needed")
    body = json.dumps({"slurm_job_id": slurm_job_id}).encode()
    deadline = time.monotonic() + wait_seconds
    while True:
        request = urllib.request.Request(
            f"{url}/api/v1/launchers/register/",
            data=body,
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                answer = json.loads(response.read())
                return int(answer["job"]), answer["job_token"]
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:300]
            if error.code not in (409, 503) or time.monotonic() > deadline:
                raise RegistrationError(f"registration refused ({error.code}): {detail}") from error
        except (urllib.error.URLError, OSError) as error:
            if time.monotonic() > deadline:
                raise RegistrationError(f"Lockstep unreachable: {error}") from error
        time.sleep(0.25)
