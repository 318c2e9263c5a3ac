"""A real OpenID Connect provider for the single sign-on tests: the npm ``oidc-provider`` (tests/support/oidc/,
installed by `npm ci` there; .ci/run does), started with node on a port of its own.

Its development login form takes any password; the login name picks one of ``accounts`` (name -> groups),
whose groups its userinfo answer carries. Lockstep is started against ``settings_env`` (the provider's endpoints
are fixed paths, so Lockstep can start first and tell the provider its callback address afterwards).
"""

import json
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.support.processes import free_port, wait_for

HERE = Path(__file__).resolve().parent / "oidc"
CLIENT_ID = "lockstep-test"
CLIENT_SECRET = "lockstep-test-client-secret-0123456789"


@dataclass
class Provider:
    port: int

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def settings_env(self, group_roles: str) -> dict:
        """Lockstep's environment for single sign-on through this provider, groups mapped by ``group_roles``."""
        return {
            "OIDC_CLIENT_ID": CLIENT_ID,
            "OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "OIDC_AUTHORIZATION_ENDPOINT": f"{self.issuer}/auth",
            "OIDC_TOKEN_ENDPOINT": f"{self.issuer}/token",
            "OIDC_USERINFO_ENDPOINT": f"{self.issuer}/me",
            "OIDC_JWKS_ENDPOINT": f"{self.issuer}/jwks",
            "OIDC_GROUP_ROLES": group_roles,
            "OIDC_PROVIDER_NAME": "Test IdP",
        }


def reserve() -> Provider:
    """A provider's port, before it starts."""
    if shutil.which("node") is None or not (HERE / "node_modules" / "oidc-provider").is_dir():
        pytest.fail(
            "node and tests/support/oidc/node_modules are needed: run `npm ci --prefix tests/support/oidc`"
        )
    return Provider(port=free_port())


@contextmanager
def running(provider: Provider, tmp_path: Path, *, redirect_uri: str, accounts: dict[str, list[str]]):
    """Run ``provider`` for the client whose callback is ``redirect_uri``, with ``accounts`` (login -> groups)."""
    config = tmp_path / f"oidc-{provider.port}.json"
    config.write_text(
        json.dumps(
            {
                "port": provider.port,
                "client_id": CLIENT_ID,
                "client_secret": CLIENT_SECRET,
                "redirect_uri": redirect_uri,
                "accounts": {name: {"groups": groups} for name, groups in accounts.items()},
            }
        )
    )
    log = tmp_path / f"oidc-{provider.port}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            ["node", str(HERE / "provider.mjs"), str(config)], cwd=HERE, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for(
            lambda: requests.get(f"{provider.issuer}/.well-known/openid-configuration", timeout=2).ok,
            20,
            what=f"oidc-provider ({log.read_text()[-500:]})",
        )
        yield provider
    finally:
        process.terminate()
        process.wait(timeout=10)
