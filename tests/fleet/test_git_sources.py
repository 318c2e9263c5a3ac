"""How git is run for a blueprint source: checked URL, pinned address, no redirects, no host configuration, only
https, and credentials in the environment, never on the command line. (git itself is replaced by a recorder here;
tests/fleet/test_sources.py runs the real one.)"""

import base64
import subprocess

import pytest

from controlplane.outbound import OutboundRefused
from fleet import git_sources

PASSWORD = "ghp_not-a-real-token-but-secret"


@pytest.fixture
def recorded(monkeypatch, settings, tmp_path):
    settings.BLUEPRINT_SOURCE_CACHE_DIR = str(tmp_path)
    settings.BLUEPRINT_SOURCE_ALLOW_FILE = False
    calls = []

    def run(args, **kwargs):
        calls.append((args, kwargs["env"]))
        out = b"0123456789abcdef0123456789abcdef01234567\n" if "rev-parse" in args else b""
        return subprocess.CompletedProcess(args, 0, out, b"")

    monkeypatch.setattr(git_sources.subprocess, "run", run)
    return calls


def _config(env) -> dict:
    return {
        env[f"GIT_CONFIG_KEY_{i}"]: env[f"GIT_CONFIG_VALUE_{i}"] for i in range(int(env["GIT_CONFIG_COUNT"]))
    }


def test_a_fetch_is_pinned_https_only_and_keeps_credentials_off_the_command_line(recorded):
    head = git_sources.fetch(
        source_id=7,
        url="https://140.82.112.3/acme/fleet.git",
        ref="main",
        credentials={"username": "bot", "password": PASSWORD},
    )
    assert head == "0123456789abcdef0123456789abcdef01234567"
    fetch_args, env = next((args, env) for args, env in recorded if "fetch" in args)
    assert fetch_args[-2:] == ["https://140.82.112.3/acme/fleet.git", "+main:refs/lockstep/head"]
    assert all(PASSWORD not in arg for args, _ in recorded for arg in args)
    config = _config(env)
    token = base64.b64encode(f"bot:{PASSWORD}".encode()).decode()
    assert config["http.extraHeader"] == f"Authorization: Basic {token}"
    assert config["http.curloptResolve"] == "140.82.112.3:443:140.82.112.3"
    assert config["protocol.allow"] == "never" and config["protocol.https.allow"] == "always"
    assert "protocol.file.allow" not in config and config["http.followRedirects"] == "false"
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["GIT_TERMINAL_PROMPT"] == "0"
    assert not {"HTTPS_PROXY", "https_proxy", "GIT_SSL_NO_VERIFY"} & set(env)


@pytest.mark.parametrize(
    "url",
    [
        "file:///srv/fleet.git",
        "https://localhost/fleet.git",
        "https://127.0.0.1/fleet.git",
        "https://[::ffff:10.0.0.1]/fleet.git",
        "http://140.82.112.3/fleet.git",
        "ext::sh -c touch% /tmp/pwned",
    ],
)
def test_refused_urls_never_reach_git(recorded, url):
    with pytest.raises(OutboundRefused):
        git_sources.fetch(source_id=7, url=url, ref="main", credentials={})
    assert recorded == []


@pytest.mark.parametrize("ref", ["-upload-pack=x", "a..b", "main:other", "refs/../x", "", "a b"])
def test_refs_that_could_read_as_options_or_ranges_are_refused(recorded, ref):
    with pytest.raises(git_sources.GitError):
        git_sources.fetch(source_id=7, url="https://140.82.112.3/f.git", ref=ref, credentials={})
    assert all("fetch" not in args for args, _ in recorded)
