"""`make run` installs only pyproject's runtime `dependencies`: every third-party module the apps import outside
their tests must come from one of them (or what they require), not from the `test` extras."""

import ast
import re
import sys
import tomllib
from importlib import metadata

from tests.support.processes import BASE_DIR

APPS = ("controlplane", "tenancy", "fleet", "jobs", "telemetry", "simulator")
# Code that runs only under the test suite or benchmarks, with the test extras installed.
TEST_ONLY = ("controlplane/testing/", "/tests/")
# Detector families tried and not shipped (docs/prediction.md): imported only by bench/predictor_nab.py --compare.
OPTIONAL = {"statsmodels", "stumpy", "river", "ruptures"}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def runtime_closure() -> set[str]:
    """The runtime dependencies and everything they require (installed metadata), normalised names."""
    pending = [
        _name(r) for r in tomllib.loads((BASE_DIR / "pyproject.toml").read_text())["project"]["dependencies"]
    ]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        # Extras named in pyproject (celery[redis], uvicorn[standard], psycopg[binary,pool]) are installed too.
        for requirement in requires:
            marker = requirement.split(";", 1)[1] if ";" in requirement else ""
            if "extra ==" in marker and not re.search(
                r"extra == ['\"](redis|standard|binary|pool)['\"]", marker
            ):
                continue
            pending.append(_name(requirement))
    return seen


def imported_modules() -> dict[str, str]:
    """Top-level modules imported by the apps' runtime code, with a file that imports each."""
    found: dict[str, str] = {}
    for app in APPS:
        for path in (BASE_DIR / app).rglob("*.py"):
            relative = str(path.relative_to(BASE_DIR))
            if "/migrations/" in relative or any(part in f"/{relative}" for part in TEST_ONLY):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], relative)
    return found


def test_the_apps_import_nothing_the_runtime_install_lacks():
    closure = runtime_closure()
    # The closure is the runtime install's: the Kubernetes driver's client is in it, the test extras are not.
    assert {"django", "kubernetes", "requests", "honcho"} <= closure
    assert not {"playwright", "schemathesis", "daphne", "pytest", "factory-boy", "torch"} & closure
    distributions = metadata.packages_distributions()
    local = set(APPS) | {"lockstep_agent"}
    missing = {}
    for module, where in imported_modules().items():
        if module in sys.stdlib_module_names or module in local or module in OPTIONAL:
            continue
        names = {d.lower().replace("_", "-") for d in distributions.get(module, [])}
        if not names & closure:
            missing[module] = (sorted(names), where)
    assert not missing, (
        f"imported at run time but not a runtime dependency (pyproject `dependencies`): {missing}"
    )
