"""No module outside a benchmark's own package (`cru_harness/benchmarks/<name>/`) spells a built-in benchmark's name
in its code: the core reads benchmarks through their hooks (`cru_harness.api.Benchmark`). The check reads every
string constant of the package's modules but docstrings (prose may name TOFU) and looks for `tofu` / `rwku` as a
word or a key prefix (`tofu_preset`, `rwku:1:passage`).

Nothing is owed: the allowlist is empty. A method's settings on a benchmark live in that benchmark's package
(`Benchmark.method_defaults`, `method_settings`, `lora_preset`, `refusals`); a benchmark's own command lives there too
and is added through the `cru_harness.commands` entry points (TOFU's `score`); a command's help names benchmarks from
the registry or in prose. A new entry needs a reason here, and is removed once its files spell no name."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cru_harness"
NAME = re.compile(r"\b(tofu|rwku)(?=\b|_)")

#: path (relative to the package, a folder ending in /) -> why it may spell a built-in benchmark's name.
ALLOWED: dict[str, str] = {}


def _spelled(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [(node.lineno, node.value[:70]) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and NAME.search(node.value)]


def _allowed(relative: str) -> bool:
    return relative.startswith("benchmarks/") and relative.count("/") >= 2 or any(
        relative == key or (key.endswith("/") and relative.startswith(key)) for key in ALLOWED)


def test_no_core_module_spells_a_benchmark_name():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if not _allowed(relative) and (hits := _spelled(path)):
            found[relative] = hits
    assert not found, ("these modules spell a benchmark's name instead of asking its plugin (cru_harness.api."
                       f"Benchmark's hooks): {found}")


def test_the_check_sees_a_name_in_code_and_not_in_a_docstring(tmp_path):
    """The check would fail on a core module that compares a benchmark's name, and passes prose about TOFU."""
    module = tmp_path / "core.py"
    module.write_text('"""Reads TOFU\'s tofu_forget01 through hooks."""\n\ndef f(b):\n    """tofu here too."""\n'
                      '    return b == "other"\n')
    assert _spelled(module) == []
    module.write_text('def f(b):\n    return b == "tofu" or b.startswith("rwku:")\n')
    assert [line for line, _ in _spelled(module)] == [2, 2]
    assert not _allowed("runner/config.py") and _allowed("benchmarks/tofu/plugin.py") and not _allowed("baselines/ga.py")


def _stale(allowed: dict[str, str]) -> list[str]:
    """The entries whose files spell no benchmark name (or are gone)."""
    stale = []
    for key in allowed:
        paths = sorted((PACKAGE / key).rglob("*.py")) if key.endswith("/") else [PACKAGE / key]
        if not any(path.is_file() and _spelled(path) for path in paths):
            stale.append(key)
    return stale


def test_the_allowlist_holds_only_what_still_spells_a_name():
    """An entry whose files no longer spell a name is removed, so the list stays the short list of what is owed."""
    assert not (stale := _stale(ALLOWED)), f"allowlist entries that spell no benchmark name any more: {stale}"
    # the check itself: an entry for a module that names TOFU is kept, one for a generic or a moved module is stale
    assert _stale({"benchmarks/tofu/score.py": "", "scoring/outputs.py": "", "scoring/score.py": "",
                   "benchmarks/rwku/": ""}) == ["scoring/outputs.py", "scoring/score.py"]
