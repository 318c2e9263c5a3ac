"""Reading a blueprint source's git repository: fetch its branch or tag into a local cache, list the commits that
changed the document, read the document as of a commit.

A source's URL is set by a user and fetched by a worker, so it follows the outbound-URL rule
(controlplane/outbound.py): https only, checked before every fetch, and git connects to the address that was
checked (``http.curloptResolve``), follows no redirect and uses no proxy, helper or configuration from the host.
``file://`` URLs (repositories on the worker's own disk) are refused unless BLUEPRINT_SOURCE_ALLOW_FILE is set,
which is for tests. Credentials reach git as an Authorization header in its environment, never on a command line.
"""

import base64
import os
import re
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.conf import settings

from controlplane.outbound import OutboundRefused, Target, check_url

SCHEMES = ("https",)
# A branch or tag name git accepts (git check-ref-format), without what could read as an option or a range.
REF = re.compile(r"^(?!-)(?!.*\.\.)(?!.*//)(?!.*@\{)[A-Za-z0-9][A-Za-z0-9._/+-]{0,254}(?<![./])$")
PATH = re.compile(r"^(?!/)(?!.*(^|/)\.\.?(/|$))[A-Za-z0-9._/+ -]{1,1024}$")
SHA = re.compile(r"^[0-9a-f]{40,64}$")
HEAD_REF = "refs/lockstep/head"
MAX_COMMITS = 50  # the newest commits one poll turns into versions; older ones in the same push are skipped


class GitError(Exception):
    """git could not do what was asked; the message says why, for the page that shows the source."""


@dataclass(frozen=True)
class Commit:
    sha: str
    author: str
    message: str
    committed_at: datetime | None


def check_source_url(url, *, resolve: bool) -> Target | None:
    """The checked target of a source URL (None for an allowed file:// URL), or OutboundRefused saying why not."""
    if isinstance(url, str) and url.lower().startswith("file:"):
        if not settings.BLUEPRINT_SOURCE_ALLOW_FILE:
            raise OutboundRefused("a URL starting https:// (file:// is only for tests)")
        if not url.startswith("file:///") or any(ord(c) < 0x20 for c in url):
            raise OutboundRefused("a file URL of an absolute path, file:///…")
        return None
    return check_url(url, schemes=SCHEMES, resolve=resolve)


def cache_root() -> Path:
    return Path(settings.BLUEPRINT_SOURCE_CACHE_DIR)


def _config(target: Target | None, credentials: dict) -> list[tuple[str, str]]:
    config = [
        ("protocol.allow", "never"),
        ("protocol.https.allow", "always"),
        ("http.followRedirects", "false"),
        ("http.lowSpeedLimit", "1000"),
        ("http.lowSpeedTime", "30"),
        ("credential.helper", ""),
        ("core.askPass", ""),
    ]
    if target is None:
        config.append(("protocol.file.allow", "always"))
    elif target.addresses:
        address = target.addresses[0]
        shown = f"[{address}]" if address.version == 6 else str(address)
        config.append(("http.curloptResolve", f"{target.host}:{target.port}:{shown}"))
    username, password = credentials.get("username") or "", credentials.get("password") or ""
    if password:
        token = base64.b64encode(f"{username or 'git'}:{password}".encode()).decode("ascii")
        config.append(("http.extraHeader", f"Authorization: Basic {token}"))
    return config


def _git(
    args: list[str], *, cwd: Path, config: list[tuple[str, str]] = (), timeout: float | None = None
) -> bytes:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "LC_ALL": "C",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ASKPASS": "",
        "GIT_CONFIG_COUNT": str(len(config)),
    }
    for i, (key, value) in enumerate(config):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            timeout=timeout or settings.BLUEPRINT_SOURCE_GIT_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise GitError(f"git {args[0]} took longer than {error.timeout:.0f} s") from None
    except OSError as error:
        raise GitError(f"git cannot run: {error}") from None
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitError(f"git {args[0]} failed: {' / '.join(said[-3:])[:500] or done.returncode}")
    return done.stdout


def fetch(*, source_id: int, url: str, ref: str, credentials: dict) -> str:
    """Fetch ``ref`` (a branch or tag) of ``url`` into the source's cache; returns the commit it names."""
    target = check_source_url(url, resolve=True)
    if not REF.match(ref):
        raise GitError(f"{ref!r} is not a branch or tag name")
    repo = cache_root() / str(int(source_id))
    repo.mkdir(parents=True, exist_ok=True)
    if not (repo / "HEAD").exists():
        _git(["init", "--bare", "--quiet", "."], cwd=repo)
    _git(
        ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--", url, f"+{ref}:{HEAD_REF}"],
        cwd=repo,
        config=_config(target, credentials),
    )
    return _git(["rev-parse", "--verify", f"{HEAD_REF}^{{commit}}"], cwd=repo).decode().strip()


def _repo(source_id: int) -> Path:
    return cache_root() / str(int(source_id))


def has_commit(*, source_id: int, sha: str) -> bool:
    if not SHA.match(sha or ""):
        return False
    try:
        _git(["cat-file", "-e", f"{sha}^{{commit}}"], cwd=_repo(source_id))
    except GitError:
        return False
    return True


FIELD, RECORD = "\x1f", "\x1e"
LOG_FORMAT = f"--format=%H{FIELD}%an <%ae>{FIELD}%cI{FIELD}%B{RECORD}"


def _parse_log(out: bytes) -> list[Commit]:
    commits = []
    for record in out.decode("utf-8", "replace").split(RECORD):
        record = record.strip("\n")
        if not record:
            continue
        sha, author, when, message = record.split(FIELD, 3)
        try:
            committed = datetime.fromisoformat(when)
        except ValueError:
            committed = None
        commits.append(
            Commit(sha=sha, author=author[:300], message=message.strip()[:5000], committed_at=committed)
        )
    return commits


def commits_changing(*, source_id: int, since: str, head: str, path: str) -> list[Commit]:
    """The commits after ``since`` up to ``head`` that changed ``path``, oldest first (at most MAX_COMMITS, the
    newest). Without a known ``since`` (a new source, a cache that was lost, a history rewritten past it), the
    head commit alone: the document as it is now."""
    repo = _repo(source_id)
    if since and has_commit(source_id=source_id, sha=since):
        span = [f"{since}..{head}"]
        out = _git(["log", LOG_FORMAT, f"--max-count={MAX_COMMITS}", *span, "--", path], cwd=repo)
        return list(reversed(_parse_log(out)))
    return _parse_log(_git(["log", LOG_FORMAT, "--max-count=1", head], cwd=repo))


def read_document(*, source_id: int, sha: str, path: str, max_bytes: int) -> bytes | None:
    """The document at ``path`` as of ``sha`` (None if the commit has no file there); GitError past max_bytes."""
    repo = _repo(source_id)
    spec = f"{sha}:{path}"
    try:
        kind = _git(["cat-file", "-t", spec], cwd=repo).decode().strip()
    except GitError:
        return None
    if kind != "blob":
        return None
    size = int(_git(["cat-file", "-s", spec], cwd=repo).decode().strip())
    if size > max_bytes:
        raise GitError(f"{path} is {size} bytes; at most {max_bytes}")
    return _git(["cat-file", "blob", spec], cwd=repo)
