"""Register a job a scheduler started with Lockstep, and get the job token its progress reports use; and the node
side of the job secret that proves a job is the job it names.

    from lockstep_agent.launcher import register_slurm_job
    job_id, job_token = register_slurm_job()      # in the job, rank 0, before training starts

Configuration from the environment: ``LOCKSTEP_URL`` and ``LOCKSTEP_LAUNCHER_TOKEN`` (an ``lsl_…`` launcher
credential bound to the job's cluster); the job is named by ``SLURM_JOB_ID``, which Slurm sets, and proves it is
that job with ``LOCKSTEP_JOB_SECRET``, which the cluster's Slurm prolog sets where the provider installed it (see
below). A requeued job registers again and gets a new token for the same Lockstep job (its earlier tokens stop
working). While Lockstep is still finishing the recovery that requeued it, the answer is 409 and this waits (up to
``wait_seconds``) so the job's first progress report after a restart counts from its checkpoint.

The job secret, on the nodes (``python -m lockstep_agent.launcher <command>``):

- ``prolog`` (slurm.conf ``Prolog``, runs as root on each node of a job before its tasks): derives the job's
  secret, HMAC-SHA256 under the cluster's job-secret key (a root-owned file, mode 0600, that no job can read; the
  same key is in the Lockstep cluster's connection as ``job_secret_key``) of the Slurm cluster name, job id, the
  job's user id and account, and writes it to ``<secret dir>/<job id>``, readable by the job's user only;
- ``task-prolog`` (``TaskProlog``, runs as the job's user before each task): prints
  ``export LOCKSTEP_JOB_SECRET=…`` from that file, which Slurm puts in the task's environment;
- ``epilog`` (``Epilog``): sets the file aside as ``<job id>.ended`` and removes those older than
  ``--keep-seconds`` (default an hour). Slurm does not run the prolog again for a job it relaunches on a node
  within its credential lifetime (a requeue Lockstep starts at once), so the relaunched run's tasks read the
  set-aside file; for the same reason the secret is the same for every run of a job;
- ``new-key``: prints a new key.

Every command exits 0, whatever goes wrong (said on stderr): a failing Slurm prolog drains its node. A job whose
prolog wrote nothing carries no secret, and Lockstep refuses its registration, saying why.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import secrets
import stat
import sys
import time
import urllib.error
import urllib.request

SECRET_ENV = "LOCKSTEP_JOB_SECRET"
KEY_MIN_LENGTH = 32
ENDED = ".ended"


class RegistrationError(RuntimeError):
    pass


def job_secret(key: str, *, cluster: str, slurm_job_id: str, uid: int, account: str) -> str:
    """The secret of a Slurm job (every run of it: a relaunch may skip the prolog). Lockstep's server derives the
    same (``jobs.launchers``) from what Slurm reports of the job; a job id Slurm reuses after its counter wraps
    gives another user's or account's job another secret."""
    message = "\n".join(["lockstep-job-secret/1", cluster, str(slurm_job_id), str(int(uid)), account])
    return hmac.new(key.strip().encode(), message.encode(), hashlib.sha256).hexdigest()


def register_slurm_job(
    *,
    url: str | None = None,
    token: str | None = None,
    slurm_job_id: str | None = None,
    secret: str | None = None,
    wait_seconds: float = 120.0,
    timeout: float = 10.0,
) -> tuple[int, str]:
    """POST /api/v1/launchers/register/; returns (Lockstep job id, job token)."""
    url = (url or os.environ.get("LOCKSTEP_URL", "")).rstrip("/")
    token = token or os.environ.get("LOCKSTEP_LAUNCHER_TOKEN", "")
    slurm_job_id = slurm_job_id or os.environ.get("SLURM_JOB_ID", "")
    secret = secret if secret is not None else os.environ.get(SECRET_ENV, "")
    if not (url and token and slurm_job_id):
        raise RegistrationError("LOCKSTEP_URL, LOCKSTEP_LAUNCHER_TOKEN and SLURM_JOB_ID are needed")
    fields = {"slurm_job_id": slurm_job_id}
    if secret:
        fields["job_secret"] = secret
    body = json.dumps(fields).encode()
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


# --- on the nodes: Slurm's prolog, task prolog and epilog -----------------------------------------------------
def _secret_path(secret_dir: str, env: dict) -> str:
    """``<secret dir>/<job id>``; ``{node}`` in the folder stands for the node's name (several emulated nodes on
    one host keep apart)."""
    job = env.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        raise ValueError(f"SLURM_JOB_ID is {job!r}, not a job id")
    return os.path.join(secret_dir.replace("{node}", env.get("SLURMD_NODENAME", "")), job)


def read_key(path: str) -> str:
    """The cluster's job-secret key; refused unless only its owner, root, may read it."""
    with open(path, "rb") as handle:
        seen = os.fstat(handle.fileno())
        if seen.st_uid != 0 or seen.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise PermissionError(f"{path} must belong to root with mode 0600 or 0400")
        key = handle.read().decode().strip()
    if len(key) < KEY_MIN_LENGTH:
        raise ValueError(f"{path} holds a key of {len(key)} characters; at least {KEY_MIN_LENGTH} are needed")
    return key


def prolog(*, key_file: str, secret_dir: str, env: dict) -> str:
    """Write the job's secret for the job's user (root only: it reads the key); returns the file's path."""
    key = read_key(key_file)
    path = _secret_path(secret_dir, env)
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o711, exist_ok=True)
    # Others may pass through to a file they know the name of, never list the folder; the file is the job's user's.
    os.chmod(folder, 0o711)
    secret = job_secret(
        key,
        cluster=env.get("SLURM_CLUSTER_NAME", ""),
        slurm_job_id=env["SLURM_JOB_ID"],
        uid=int(env["SLURM_JOB_UID"]),
        account=env.get("SLURM_JOB_ACCOUNT", ""),
    )
    scratch = f"{path}.{os.getpid()}.new"
    descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    try:
        os.write(descriptor, secret.encode())
        os.fchown(descriptor, int(env["SLURM_JOB_UID"]), int(env.get("SLURM_JOB_GID") or -1))
    finally:
        os.close(descriptor)
    os.replace(scratch, path)
    return path


def task_prolog(*, secret_dir: str, env: dict) -> str:
    """The line Slurm's TaskProlog prints to put the job's secret in the task's environment ('' when none): from
    this run's prolog, else from an earlier run's on this node (a relaunch whose prolog Slurm skipped)."""
    path = _secret_path(secret_dir, env)
    for candidate in (path, f"{path}{ENDED}"):
        try:
            with open(candidate) as handle:
                secret = handle.read().strip()
        except FileNotFoundError:
            continue
        return f"export {SECRET_ENV}={secret}" if secret.isalnum() else ""
    return ""


def epilog(*, secret_dir: str, env: dict, keep_seconds: float = 3600.0) -> None:
    """Set the run's secret aside (a relaunch on this node may find it there) and remove those set aside more
    than ``keep_seconds`` ago: by then Slurm runs the prolog again for a relaunch."""
    path = _secret_path(secret_dir, env)
    try:
        os.replace(path, f"{path}{ENDED}")
    except FileNotFoundError:
        pass
    folder, now = os.path.dirname(path), time.time()
    for name in os.listdir(folder):
        if name.endswith(ENDED) and name[: -len(ENDED)].isdigit():
            try:
                if now - os.stat(os.path.join(folder, name)).st_mtime > keep_seconds:
                    os.unlink(os.path.join(folder, name))
            except FileNotFoundError:
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lockstep_agent.launcher", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("prolog", "task-prolog", "epilog"):
        command = commands.add_parser(name)
        command.add_argument("--secret-dir", default="/run/lockstep/jobs")
        if name == "prolog":
            command.add_argument("--key-file", default="/etc/lockstep/job-secret.key")
        if name == "epilog":
            command.add_argument("--keep-seconds", type=float, default=3600.0)
    commands.add_parser("new-key")
    args = parser.parse_args(argv)
    if args.command == "new-key":
        print(secrets.token_hex(32))
        return 0
    try:
        if args.command == "prolog":
            prolog(key_file=args.key_file, secret_dir=args.secret_dir, env=dict(os.environ))
        elif args.command == "task-prolog":
            line = task_prolog(secret_dir=args.secret_dir, env=dict(os.environ))
            if line:
                print(line)
        else:
            epilog(secret_dir=args.secret_dir, env=dict(os.environ), keep_seconds=args.keep_seconds)
    except (OSError, ValueError, KeyError) as error:
        print(f"lockstep {args.command}: {error}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
