"""The `study:` block of a study config, validated like the runner's keys (errors name the key)."""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..runner.config import ConfigError, ExperimentConfig, validate_config

KINDS = ("sweep", "overlap", "gate_gap")
_KEYS = ("kind", "title", "x", "collapse_line", "examples", "rows")
STUDY_DIR = "study"   # inside the run's output_dir: the study's tables, plots and analysis caches


@dataclass(frozen=True)
class StudySpec:
    kind: str
    title: str
    x: str | None = None                 # sweep: the CRU hyperparameter on the plot's x axis (e.g. lam)
    collapse_line: bool = False          # sweep with x=lam: draw 1 - 1/(2 lam) on the gate plot
    examples: tuple = (40, "all")        # overlap: examples per corpus for each localization
    rows: int | None = 40                # gate_gap: rows of each corpus whose tokens are measured (None = all)
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Study:
    spec: StudySpec
    config: ExperimentConfig

    @property
    def out_dir(self) -> Path:
        return Path(self.config.output_dir) / STUDY_DIR


def _fail(key: str, message: str, source: str | None):
    raise ConfigError(f"study.{key}" if key else "study", message, source)


def validate_study(raw: Any, source: str | None = None) -> Study:
    """A parsed study YAML (runner keys + `study:`) -> `Study`. Raises `ConfigError` naming the key."""
    if not isinstance(raw, dict) or "study" not in raw:
        raise ConfigError("study", "is required: a study config is a runner config plus a `study:` block "
                          f"(kind: {', '.join(KINDS)})", source)
    raw = copy.deepcopy(raw)
    block = raw.pop("study")
    if not isinstance(block, dict):
        _fail("", f"expected a mapping, got {block!r}", source)
    for key in block:
        if key not in _KEYS:
            _fail(str(key), f"unknown key; allowed here: {', '.join(_KEYS)}", source)
    kind = block.get("kind")
    if kind not in KINDS:
        _fail("kind", f"expected one of {', '.join(KINDS)}, got {kind!r}", source)
    config = validate_config(raw, source)
    title = block.get("title", config.name)
    if not isinstance(title, str):
        _fail("title", f"expected a string, got {title!r}", source)
    x = block.get("x")
    if x is not None and (kind != "sweep" or not isinstance(x, str)):
        _fail("x", "a sweep's x axis: the name of a CRU hyperparameter (e.g. lam, percentile)", source)
    collapse = block.get("collapse_line", False)
    if not isinstance(collapse, bool) or (collapse and x != "lam"):
        _fail("collapse_line", "true only with x: lam (the line 1 - 1/(2 lam) is a function of lambda)", source)
    examples = block.get("examples", [40, "all"])
    if not isinstance(examples, list) or not examples or not all(
            e == "all" or (isinstance(e, int) and not isinstance(e, bool) and e >= 2) for e in examples):
        _fail("examples", f"expected a list of example counts (integers >= 2) or 'all', got {examples!r}", source)
    rows = block.get("rows", 40)
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        _fail("rows", f"expected a positive integer or null (all rows), got {rows!r}", source)
    if kind in ("overlap", "gate_gap") and not any(m.method == "CRU" for m in config.methods):
        _fail("kind", f"a {kind} study analyses CRU: list at least one CRU method (its localization "
              "settings and corpora are the ones analysed)", source)
    spec = StudySpec(kind=kind, title=title, x=x, collapse_line=collapse, examples=tuple(examples), rows=rows,
                     raw=block)
    return Study(spec, config)


def load_study(path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> Study:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"study config not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError("<file>", f"not valid YAML: {err}", str(path)) from err
    if overrides and isinstance(raw, dict):
        raw = {**raw, **overrides}
    return validate_study(raw, source=str(path))
