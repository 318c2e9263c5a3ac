"""The job's protection secret, and the keys the runtime derives from it.

One secret per job, the same on every rank and across the job's relaunches (a relaunched process must prove it is
the job whose slots the holders keep). It is found, first match wins:

1. ``Protection(secret=...)``;
2. ``LOCKSTEP_PROTECT_SECRET`` in the environment (at least 32 characters: ``openssl rand -hex 32``), set by
   whatever launches the job, once per job (Slurm keeps a job's submit-time environment across requeues);
3. ``LOCKSTEP_PROTECT_SECRET_FILE``: a file holding it, owned by the job's user, mode 0600 or 0400;
4. otherwise a key file the runtime creates on the job's first start (rank 0, 32 random bytes, mode 0600 in a
   folder of mode 0700): ``<checkpoint_dir>/<job>/protect.key``, or ``~/.lockstep/protect/<job>.key`` without a
   checkpoint folder. Rank 0 reads it on each relaunch and hands it to the other ranks over the job's own gloo
   group (never through the rendezvous store).

A file holding a secret is refused unless it belongs to the user reading it and nobody else may read it.

From the secret come three keys, each bound to the job's name, kept in memory only: the holder key (the holder's
proof that a request is the job's), the snapshot key (the tag on every snapshot, which the holder never sees) and
the heartbeat key (the tag on every heartbeat in the rendezvous store).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass

SECRET_ENV = "LOCKSTEP_PROTECT_SECRET"
SECRET_FILE_ENV = "LOCKSTEP_PROTECT_SECRET_FILE"
MIN_SECRET_CHARACTERS = 32
KEY_FILE = "protect.key"


@dataclass(frozen=True)
class JobKeys:
    job: str
    holder: bytes
    snapshot: bytes
    beat: bytes
    fingerprint: str  # not secret: equal on two ranks exactly when their secrets are

    def __repr__(self) -> str:  # never print a key
        return f"JobKeys(job={self.job!r}, fingerprint={self.fingerprint!r})"


def root(secret: bytes) -> bytes:
    """The 32-byte root every key is derived from (what rank 0 hands to the others)."""
    return hmac.new(secret, b"lockstep-protect/1/root", hashlib.sha256).digest()


def derive(root_key: bytes, job: str) -> JobKeys:
    def key(purpose: str) -> bytes:
        return hmac.new(root_key, f"lockstep-protect/1/{purpose}/{job}".encode(), hashlib.sha256).digest()

    return JobKeys(job, key("holder"), key("snapshot"), key("beat"), key("fingerprint").hex()[:16])


def parse_secret(text: str | bytes, *, where: str) -> bytes:
    value = text.strip() if isinstance(text, bytes) else text.strip().encode()
    if len(value) < MIN_SECRET_CHARACTERS:
        raise ValueError(
            f"the protection secret in {where} has {len(value)} characters; at least {MIN_SECRET_CHARACTERS} are "
            "needed (e.g. `openssl rand -hex 32`)"
        )
    return value


def read_secret_file(path: str) -> bytes:
    """The secret in ``path``; refused unless the file is this user's and nobody else may read or write it."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        seen = os.fstat(descriptor)
        if not stat.S_ISREG(seen.st_mode):
            raise PermissionError(f"{path} is not a regular file")
        if seen.st_uid != os.geteuid() or seen.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise PermissionError(
                f"{path} must belong to uid {os.geteuid()} with mode 0600 or 0400 (it has uid {seen.st_uid}, "
                f"mode {stat.S_IMODE(seen.st_mode):04o}): anyone who reads it can read and plant this job's snapshots"
            )
        return parse_secret(os.read(descriptor, 4096), where=path)
    finally:
        os.close(descriptor)


def read_or_create_secret_file(path: str) -> bytes:
    """The secret in ``path``, created (32 random bytes, hex, mode 0600, atomically) when there is none yet."""
    try:
        return read_secret_file(path)
    except FileNotFoundError:
        pass
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, mode=0o700, exist_ok=True)
    scratch = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
    descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(descriptor, secrets.token_hex(32).encode())
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    try:
        os.link(scratch, path)  # fails if another process made it first: then theirs is the secret
    except FileExistsError:
        pass
    finally:
        os.unlink(scratch)
    return read_secret_file(path)


def configured_secret(explicit: bytes | str | None = None) -> bytes | None:
    """The secret given to this process (argument, ``LOCKSTEP_PROTECT_SECRET``, ``LOCKSTEP_PROTECT_SECRET_FILE``);
    None when none is."""
    if explicit is not None:
        return parse_secret(explicit, where="secret=")
    if os.environ.get(SECRET_ENV):
        return parse_secret(os.environ[SECRET_ENV], where=SECRET_ENV)
    if os.environ.get(SECRET_FILE_ENV):
        return read_secret_file(os.environ[SECRET_FILE_ENV])
    return None


def default_secret_file(checkpoint_dir: str | None, job: str) -> str:
    if checkpoint_dir:
        return os.path.join(checkpoint_dir, job, KEY_FILE)
    return os.path.join(os.path.expanduser("~"), ".lockstep", "protect", f"{job}.key")


def new_secret() -> str:
    """A new job secret (64 hex digits), for a launcher to put in ``LOCKSTEP_PROTECT_SECRET``."""
    return secrets.token_hex(32)
