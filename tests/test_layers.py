"""The package's layers point one way (docs/architecture.md): the import-linter contract in pyproject.toml holds,
and the lm-eval task folders use only the project's public metric / prompt / data API."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: What a task's utils.py may import of the project: its public, lm-eval-facing API (the metrics, prompts and data
#: loaders, the protocol's markers, lm-eval metadata, dataset and request-cache helpers, the user errors, the
#: testbed's names); and its own benchmark's package.
TASK_IMPORTS = ("cru_harness.metrics", "cru_harness.prompts", "cru_harness.protocol", "cru_harness.data",
                "cru_harness.errors", "cru_harness.lmeval.metadata", "cru_harness.lmeval.request_cache",
                "cru_harness.lmeval.dataset", "cru_harness.testbed.names",   # `testbed:` data and model names
                "cru_harness")


def test_the_layer_contract_holds():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    done = subprocess.run([lint, str(REPO / "pyproject.toml")], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    # the layers, no import cycle inside the runner, and the core importing no specific plugin
    assert "3 kept, 0 broken" in done.stdout and "no import cycle inside the runner KEPT" in done.stdout


def _lint_with(tmp_path, module: str, code: str) -> subprocess.CompletedProcess:
    """`lint-imports` on a copy of the package whose `module` (a path under cru_harness/) has `code` appended."""
    copy = tmp_path / "cru_harness"
    shutil.copytree(REPO / "cru_harness", copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text() + code)
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    return subprocess.run([lint, str(tmp_path / "pyproject.toml")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})


def test_the_contract_catches_an_upward_import(tmp_path):
    """The same contract on a copy of the package with one upward import (the foundation importing the runner)
    breaks: the check is not vacuous."""
    done = _lint_with(tmp_path, "errors.py", "\n\ndef _upward():\n    from cru_harness.runner import plan  # noqa\n")
    assert done.returncode != 0 and "cru_harness.errors -> cru_harness.runner.plan" in done.stdout, done.stdout[-2000:]


def test_the_contract_catches_an_import_cycle_inside_the_runner(tmp_path):
    """A runner module importing one that imports it (the evaluation importing the executor back) breaks the
    acyclic contract, though the layers allow it (both are in the runner)."""
    done = _lint_with(tmp_path, "runner/evaluation.py",
                      "\n\ndef _back():\n    from .execute import execute_cell  # noqa\n")
    assert done.returncode != 0 and "no import cycle inside the runner BROKEN" in done.stdout, done.stdout[-2000:]
    assert ".execute -> .evaluation" in done.stdout and "cru_harness layers KEPT" in done.stdout


def test_the_contract_catches_the_core_importing_a_benchmark(tmp_path):
    """A core module importing one benchmark's package (instead of asking the registry) breaks the forbidden
    contract, though the layers allow it (the runner sits above the benchmarks)."""
    done = _lint_with(tmp_path, "runner/plan.py",
                      "\n\ndef _named():\n    from ..benchmarks.tofu import BENCHMARK  # noqa\n")
    assert done.returncode != 0 and "cru_harness.runner.plan -> cru_harness.benchmarks.tofu" in done.stdout, \
        done.stdout[-2000:]
    assert "cru_harness layers KEPT" in done.stdout


def test_task_folders_import_only_the_public_api():
    """A benchmark's task code (`cru_harness/benchmarks/<name>/tasks/utils.py`) imports the public API and its own
    benchmark's package, never another benchmark's."""
    found = sorted((REPO / "cru_harness" / "benchmarks").glob("*/tasks/utils.py"))
    assert any("tofu" in path.parts for path in found) and any("rwku" in path.parts for path in found)
    for utils in found:
        own = f"cru_harness.benchmarks.{utils.parent.parent.name}"
        tree = ast.parse(utils.read_text())
        for node in ast.walk(tree):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name.startswith("cru_harness"):
                    allowed = name in TASK_IMPORTS or any(name.startswith(f"{api}.") for api in TASK_IMPORTS[:4]) \
                        or name == own or name.startswith(f"{own}.")
                    assert allowed, f"{utils.relative_to(REPO)} imports {name}"
