"""Test support lives in tests/support/: tests import helpers only from there (never from a conftest or from another
test module), and the product imports nothing from tests/."""

import ast

from tests.support.processes import BASE_DIR

APPS = ("controlplane", "tenancy", "fleet", "jobs", "telemetry", "simulator")


def _imports(path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.ImportFrom):
            names.append("." * node.level + (node.module or ""))
    return names


def test_tests_import_helpers_only_from_tests_support():
    wrong = {}
    for path in (BASE_DIR / "tests").rglob("*.py"):
        for name in _imports(path):
            last = name.rsplit(".", 1)[-1]
            if (
                name.startswith(".")
                or last == "conftest"
                or (name.startswith("tests.") and not name.startswith("tests.support"))
                or (name.startswith("tests.support") and last.startswith("test_"))
            ):
                wrong.setdefault(str(path.relative_to(BASE_DIR)), []).append(name)
    assert not wrong, f"import shared helpers from tests/support/ (fixtures belong in a conftest): {wrong}"


def test_the_product_imports_nothing_from_tests():
    wrong = {}
    for app in APPS:
        for path in (BASE_DIR / app).rglob("*.py"):
            found = [name for name in _imports(path) if name == "tests" or name.startswith("tests.")]
            if found:
                wrong[str(path.relative_to(BASE_DIR))] = found
    assert not wrong, f"product code imports test support: {wrong}"
