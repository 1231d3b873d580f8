"""The house rules that the code's shape must keep: the import contracts of pyproject.toml hold (import-linter:
costmodel imports no other project package, executor only costmodel, only planner's command layer imports
executor, no torch or megatron in costmodel or planner, no import cycle between the modules of a package), and
they catch a violation; no function in costmodel / planner / executor is over MAX_FUNCTION_LINES lines; every
module opens with a docstring saying its job.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("costmodel", "planner", "executor")
MAX_FUNCTION_LINES = 120
CONTRACTS = ("costmodel imports no other project package", "executor imports only costmodel",
             "only the command layer of planner imports executor", "no torch or megatron in costmodel or planner",
             "no import cycles between the modules of a package")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the checkout at ``root`` (its own pyproject.toml, its packages first on the path)."""
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_import_contracts_hold():
    out = lint_imports(ROOT)
    report = out.stdout + out.stderr
    for name in CONTRACTS:   # every contract was checked (a renamed or dropped one would pass silently)
        assert f"{name} KEPT" in report or f"{name} BROKEN" in report, report
    assert out.returncode == 0, report


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + "\n\n" + text)


def test_import_contracts_catch_violations(tmp_path):
    """A copy of the packages with one violation of each contract: every contract is reported broken."""
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    _append(tmp_path / "costmodel" / "flops.py", "def _bad():\n    from planner import space  # noqa: F401\n")
    _append(tmp_path / "planner" / "space.py",
            "def _bad():\n    import torch  # noqa: F401\n    from executor import data  # noqa: F401\n")
    _append(tmp_path / "executor" / "data.py",
            "def _bad():\n    from planner import space  # noqa: F401\n    from executor import report  # noqa: F401\n")
    _append(tmp_path / "executor" / "report.py", "def _bad():\n    from executor import data  # noqa: F401\n")
    out = lint_imports(tmp_path)
    report = out.stdout + out.stderr
    assert out.returncode != 0, report
    for name in CONTRACTS:
        assert f"{name} BROKEN" in report, report
    assert "costmodel.flops -> planner.space" in report and "planner.space -> torch" in report, report
    assert "planner.space -> executor.data" in report and "executor.data -> planner.space" in report, report


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield path.relative_to(ROOT), ast.parse(path.read_text(), filename=str(path))


def test_no_function_over_the_limit():
    long = [f"{path}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for path, tree in _modules() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_every_module_opens_with_a_docstring():
    missing = [str(path) for path, tree in _modules() if not (ast.get_docstring(tree) or "").strip()]
    assert not missing, "modules without an opening docstring: " + ", ".join(missing)
