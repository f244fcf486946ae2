"""The `study:` block of a study config, validated like the runner's keys (errors name the key)."""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MissingInputError
from ..runner.config import ConfigError, ExperimentConfig, config_path, method_plugin
from ..runner.tuning import validate_with_tuning

KINDS = ("sweep", "overlap", "gate_gap")
_KEYS = ("kind", "title", "x", "collapse_line", "examples", "rows", "scale", "note", "paper")
STUDY_DIR = "study"   # inside the run's output_dir: the study's tables, plots and analysis caches


@dataclass(frozen=True)
class StudySpec:
    kind: str
    title: str
    x: str | None = None                 # sweep: the CRU hyperparameter on the plot's x axis (e.g. lam)
    collapse_line: bool = False          # sweep with x=lam: draw 1 - 1/(2 lam) on the gate plot
    examples: tuple = (40, "all")        # overlap: examples per corpus for each localization
    rows: int | None = 40                # gate_gap: rows of each corpus whose tokens are measured (None = all)
    scale: str | None = None             # the runner config whose models / benchmarks / evaluation replaced the study's
    note: str | None = None              # printed under the table's header: what a reader must know (e.g. what is left out)
    paper: bool = False                  # overlap / gate_gap: a summary table beside the paper's figures (paper.md)
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
    config = validate_with_tuning(raw, source)
    title = block.get("title", config.name)
    if not isinstance(title, str):
        _fail("title", f"expected a string, got {title!r}", source)
    x = block.get("x")
    if x is not None:
        # a study sweeps the settings of the adapter method it lists (`Method.adapter`: CRU's routers)
        adapter = next((p for p in _listed(config) if p.adapter), None)
        names = adapter.hparams() if adapter is not None else {}
        x = adapter.aliases.get(x, x) if adapter is not None and isinstance(x, str) else x   # `lambda` -> `lam`
        if kind != "sweep" or x not in names:
            _fail("x", f"a sweep's x axis: the name of a hyperparameter of the adapter method it lists "
                  f"({', '.join(names) or 'none listed'}), got {block['x']!r}", source)
    collapse = block.get("collapse_line", False)
    if not isinstance(collapse, bool):
        _fail("collapse_line", f"expected true or false, got {collapse!r}", source)
    if collapse and x != "lam":
        _fail("collapse_line", "true only with x: lam (the line 1 - 1/(2 lam) is a function of lambda)", source)
    examples = block.get("examples", [40, "all"])
    if not isinstance(examples, list) or not examples or not all(
            e == "all" or (isinstance(e, int) and not isinstance(e, bool) and e >= 2) for e in examples):
        _fail("examples", f"expected a list of example counts (integers >= 2) or 'all', got {examples!r}", source)
    rows = block.get("rows", 40)
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        _fail("rows", f"expected a positive integer or null (all rows), got {rows!r}", source)
    if kind in ("overlap", "gate_gap") and not any(p.adapter for p in _listed(config)):
        _fail("kind", f"a {kind} study analyses CRU: list at least one CRU method (its localization "
              "settings and corpora are the ones analysed)", source)
    scale = block.get("scale")
    if scale is not None and not isinstance(scale, str):
        _fail("scale", f"the runner config the study was scaled to (set by --scale), got {scale!r}", source)
    note = block.get("note")
    if note is not None and (not isinstance(note, str) or not note.strip()):
        _fail("note", f"expected a non-empty string, printed under the table's header, got {note!r}", source)
    paper = block.get("paper", False)
    if not isinstance(paper, bool):
        _fail("paper", f"expected true or false, got {paper!r}", source)
    if paper and kind not in ("overlap", "gate_gap"):
        _fail("paper", "true only for an overlap or gate_gap study (the paper reports those two figures)", source)
    spec = StudySpec(kind=kind, title=title, x=x, collapse_line=collapse, examples=tuple(examples), rows=rows,
                     scale=scale, note=" ".join(note.split()) if note else None, paper=paper, raw=block)
    return Study(spec, config)


def _read_yaml(path: Path, what: str) -> Any:
    path = config_path(path)
    if not path.is_file():
        raise MissingInputError(f"{what} not found: {path}")
    from ..yamlfile import read_yaml

    return read_yaml(path)   # bounded as a runner config is: size, encoding, nesting, aliases


# What a scale config (a runner config such as configs/cpu_smollm2.yaml) sets in a study: where and on what it runs.
SCALE_KEYS = ("models", "benchmarks", "evaluation", "device", "data_dir")


def apply_scale(raw: dict, scale: dict, scale_path: str) -> dict:
    """The study `raw` run at another scale: `SCALE_KEYS` from the runner config `scale`, restricted to the
    study's benchmarks (a TOFU study stays TOFU) and with the tasks the study lists, its logit-lens setting, its
    methods and `study:` block kept; output under `<output_dir>-<scale name>` so results of two scales never share
    cells or tables."""
    if not isinstance(scale, dict) or not isinstance(scale.get("benchmarks"), dict):
        raise ConfigError("--scale", "expected a runner config with `models` and `benchmarks`", scale_path)
    own = raw.get("benchmarks") or {}
    benchmarks = {}
    for bench, spec in scale["benchmarks"].items():
        if bench not in own:
            continue
        # the scale says on what and how much (splits, limit, corpora, data); the study says what it measures: tasks
        # a study lists stay its own, so a scale config that scores more (a privacy task) does not change its cells
        mine = own.get(bench) if isinstance(own, dict) else None
        if isinstance(spec, dict) and isinstance(mine, dict) and "tasks" in mine:
            spec = {**spec, "tasks": mine["tasks"]}
        benchmarks[bench] = spec
    if not benchmarks:
        raise ConfigError("--scale", f"configures none of the study's benchmarks ({', '.join(sorted(own))})",
                          scale_path)
    models = []
    for model in scale.get("models") or []:
        model = dict(model)
        if "benchmarks" in model:
            kept = [b for b in ([model["benchmarks"]] if isinstance(model["benchmarks"], str) else model["benchmarks"])
                    if b in benchmarks]
            if not kept:
                continue
            model["benchmarks"] = kept
        models.append(model)
    scaled = {**raw, **{k: scale[k] for k in SCALE_KEYS if k in scale}, "benchmarks": benchmarks, "models": models}
    # the logit lens is a measurement, like the tasks: the study's own setting (off unless it asks), not the scale's
    study_evaluation = raw.get("evaluation") or {}
    if isinstance(scaled.get("evaluation"), dict):
        evaluation = {k: v for k, v in scaled["evaluation"].items() if k != "logit_lens"}
        if "logit_lens" in study_evaluation:
            evaluation["logit_lens"] = study_evaluation["logit_lens"]
        scaled["evaluation"] = evaluation
    name = scale.get("name") or Path(scale_path).stem
    scaled["output_dir"] = f"{raw.get('output_dir') or Path('results') / raw.get('name', 'study')}-{name}"
    scaled["study"] = {**raw["study"], "scale": scale_path}
    return scaled


def load_study(path: str | os.PathLike, overrides: dict[str, Any] | None = None, *,
               scale: str | os.PathLike | None = None) -> Study:
    """Read a study YAML; `scale`: a runner config whose models / benchmarks / evaluation replace the study's
    (`apply_scale`); `overrides`: top-level keys (output_dir, seeds) applied last."""
    path = Path(path)
    raw = _read_yaml(path, "study config")
    if scale is not None and isinstance(raw, dict) and isinstance(raw.get("study"), dict):
        raw = apply_scale(raw, _read_yaml(Path(scale), "--scale config"), str(scale))
    if overrides and isinstance(raw, dict):
        raw = {**raw, **overrides}
    return validate_study(raw, source=str(path))


def _listed(config: ExperimentConfig) -> list:
    """The method plugins a study's config lists, in its order."""
    return [method_plugin(m.method) for m in config.methods]
