"""No function in product code runs over 80 lines: a reader follows one in a screen or two (issue 27). The decision
core is exempt (issue 27 leaves it to the fault-path work): ``decide`` (what to do for a batch of incidents), the
planner's ``options_for`` (the priced options for one hit), ``plan_hit`` (choosing and placing one) and
``recovery_fall_back`` (the next option when a recovery fails)."""

import ast
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
LIMIT = 80
# Every Django app (a folder with an apps.py, so a new one is walked too), and the node agent.
PACKAGES = (*sorted(path.parent.name for path in BASE.glob("*/apps.py")), "agent/lockstep_agent")
# Not product code: schema history, and the test settings.
SKIPPED_FOLDERS = {"migrations", "tests"}
SKIPPED_PATHS = ("controlplane/testing/",)
EXEMPT = {
    ("jobs/services/recovery.py", "decide"),
    ("jobs/planner.py", "options_for"),
    ("jobs/services/planning.py", "plan_hit"),
    ("jobs/services/fallback.py", "recovery_fall_back"),
}


def long_functions(limit: int = LIMIT, exempt=EXEMPT) -> list[str]:
    """``path:line name (lines)`` for every function or method longer than ``limit`` lines (its ``def`` line to
    its last line, decorators not counted), nested ones included."""
    found = []
    for package in PACKAGES:
        for path in sorted((BASE / package).rglob("*.py")):
            relative = path.relative_to(BASE).as_posix()
            if SKIPPED_FOLDERS & set(path.relative_to(BASE).parts) or relative.startswith(SKIPPED_PATHS):
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=relative)):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                lines = node.end_lineno - node.lineno + 1
                if lines > limit and (relative, node.name) not in exempt:
                    found.append(f"{relative}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_product_code_is_over_80_lines():
    assert long_functions() == [], "split these into named steps"


def test_the_walk_sees_every_package_and_nested_functions():
    """Lower the limit and the walk finds functions in each package, nested ones too (it reads the right files)."""
    found = long_functions(limit=5, exempt=set())
    for package in PACKAGES:
        assert any(entry.startswith(f"{package}/") for entry in found), package
    assert any(" node (" in entry for entry in found)  # simulator/whatif.py's _job_nodes.node, nested
