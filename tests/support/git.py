"""Git repositories made on disk for the blueprint source tests (real ``git``; the source reads them by file://)."""

import os
import subprocess
from pathlib import Path

import yaml

from tests.support.blueprints import ADDONS

AUTHOR = "Ada Lovelace <ada@example.org>"


def version_document(addons=ADDONS, policy=None, **extra) -> str:
    """A ``kind: BlueprintVersion`` document as a source's file holds it (by default, what
    ``tests.support.blueprints.blueprint`` makes version 1 of)."""
    document = {
        "apiVersion": "lockstep.io/v1",
        "kind": "BlueprintVersion",
        "addons": addons,
        "policy": {"protection": {"nic_failover": True}} if policy is None else policy,
        **extra,
    }
    return yaml.safe_dump(document, sort_keys=False)


class Repository:
    """A non-bare repository on branch ``main`` with commits made by ``commit``."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.git("init", "--quiet", "--initial-branch=main")

    @property
    def url(self) -> str:
        return self.path.resolve().as_uri()

    def git(self, *args: str) -> str:
        name, email = AUTHOR[: AUTHOR.index(" <")], AUTHOR[AUTHOR.index("<") + 1 : -1]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.path),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": name,
            "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": name,
            "GIT_COMMITTER_EMAIL": email,
        }
        done = subprocess.run(
            ["git", *args], cwd=self.path, env=env, capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    def commit(self, files: dict[str, str], message: str) -> str:
        """Write ``files`` (path → text) and commit them; returns the commit id."""
        for name, text in files.items():
            target = self.path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            self.git("add", name)
        self.git("commit", "--quiet", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")
