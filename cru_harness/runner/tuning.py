"""`tuning:`: each method's hyperparameters chosen on a validation unit by one rule named in the config before any
result exists (docs/protocol.md, "Tuning").

A tuned run first runs its validation cells: for every tuned method entry, one cell per setting of its grid (the
method's default, `api.Method.tuning_grid`, or the config's `tuning.grids`) on each validation unit and validation
seed, beside the validation unit's Original (and oracle, where its benchmark has one). The rule then picks one
setting per entry from those cells' scores (`choose`: a pure function of the scores), the choice is saved with every
validation cell's score (`tuning/<model>.json` in the run directory; the report's "Tuning" section), and the
reported cells of that entry run with it: their hyperparameters hold the chosen values and their `extra.tuning` the
rule, the grid, the choice and the validation cells' hashes, so their hashes change whenever any of those would.

Checked when the config is read (one line each): the validation unit shares no item with a reported unit
(`Benchmark.unit_items`), a fine-tuned model was taught the validation unit (`Benchmark.corpus_items` of its
`finetune.data`), and every tuned entry gets the same budget: the sum over its grid of each setting's steps
(epochs x batches of the validation forget corpus).

The checks plan the validation cells (`runner.plan`), which reads `runner.config`: so `runner.config.validate_config`
leaves the block as written, and a config is read with its tuning checked here (`validate_with_tuning`,
`load_with_tuning`), above both. Running the cells takes the executor its caller gives (`runner.cli`)."""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable

from ..errors import InputError
from ..reporting.stats import is_number
from ..reporting.tuning import TUNING_DIR
from ..validation import ConfigError, _fail, _number
from .config import (ExperimentConfig, _validate_hparams, benchmark_plugin, method_plugin, read_config_file,
                     validate_config, validated)
from .plan import build_plan
from .schema import Tuning, check_keys

#: The rules a config may name, and what each picks. Only these: a rule is chosen before any result, so it must be
#: one that cannot be bent to a result afterwards.
RULES = {
    "forgetting_at_utility": "the highest forgetting (the validation benchmark's forgetting axis) among the settings "
                             "whose utility stays >= r x the Original's",
    "forget_quality_at_utility": "the highest Forget Quality (against the validation unit's own oracle) among the "
                                 "settings whose utility stays >= r x the Original's",
}
FALLBACK = "no setting keeps r x the Original's utility: the one with the highest utility"
TIES = "ties go to the earlier setting in grid order"
MAX_SETTINGS = 64
RECORD_SCHEMA = 1


@dataclass(frozen=True)
class TuningSpec:
    """`tuning:` resolved: the rule, each tuned label's settings (canonical hyperparameters, grid order) and where
    they come from, and the validation cells' config."""
    rule: str
    ratio: float
    settings: dict[str, list[dict[str, Any]]]
    sources: dict[str, str]
    budgets: dict[str, str]
    validation: ExperimentConfig


def setting_label(label: str, setting: dict[str, Any]) -> str:
    """A validation cell's row name: `GA [learning_rate=1e-05]`."""
    values = ", ".join(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
                       for key, value in setting.items())
    return f"{label} [{values}]"


def expand_grid(grid: Any, where: str, source: str | None) -> list[dict[str, Any]]:
    """`{hparam: [values]}` -> its settings, the first key varying slowest (the order ties go by)."""
    if not isinstance(grid, dict) or not grid:
        _fail(where, f"expected a mapping {{hyperparameter: [values]}}, got {grid!r}", source)
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            _fail(f"{where}.{key}", f"expected a non-empty list of values, got {values!r}", source)
        if len(set(map(repr, values))) != len(values):
            _fail(f"{where}.{key}", f"repeats a value: {values}", source)
    settings = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    if len(settings) > MAX_SETTINGS:
        _fail(where, f"{len(settings)} settings; at most {MAX_SETTINGS}", source)
    return settings


def _entry(raw: dict, index: int) -> dict:
    entry = raw["methods"][index]
    return {"method": entry} if isinstance(entry, str) else dict(entry)


def validate_tuning(raw: dict, config: ExperimentConfig, source: str | None) -> TuningSpec:
    """Check `tuning:` against the rest of the config (validated already) and resolve it."""
    block = raw["tuning"]
    check_keys(Tuning, block, "tuning", source)
    for required in ("rule", "validation"):
        if required not in block:
            _fail(f"tuning.{required}", "is required", source)
    rule = block["rule"]
    if rule not in RULES:
        _fail("tuning.rule", f"unknown rule {rule!r}; one of: {', '.join(RULES)}", source)
    ratio = float(_number(block.get("utility_ratio", 0.9), "tuning.utility_ratio", source, above=0, high=10))
    if len(config.models) != 1:
        _fail("tuning", f"chooses one setting per method entry for one model; this config has {len(config.models)} "
              "models: give each its own config", source)
    labels = _tuned_labels(block, config, source)
    grids_raw = block.get("grids") or {}
    if not isinstance(grids_raw, dict):
        _fail("tuning.grids", "expected a mapping {label: {hyperparameter: [values]}}", source)
    for label in grids_raw:
        if label not in labels:
            _fail(f"tuning.grids.{label}", f"is not a tuned label; tuned: {', '.join(labels)}", source)
    settings, sources = {}, {}
    for label, spec in labels.items():
        plugin = method_plugin(spec.method)
        where = f"tuning.grids.{label}"
        grid = grids_raw.get(label)
        if grid is None:
            if not plugin.tuning_grid:
                _fail(where, f"{spec.method} has no default grid: give one ({{hyperparameter: [values]}})", source)
            grid, sources[label] = plugin.tuning_grid["grid"], plugin.tuning_grid["source"]
        else:
            sources[label] = "the config's grid"
        settings[label] = [_validate_hparams(spec.method, setting, where, source)
                           for setting in expand_grid(grid, where, source)]
    overrides = block.get("overrides") or {}
    if not isinstance(overrides, dict):
        _fail("tuning.overrides", "expected a mapping {hyperparameter: value}", source)
    for key in overrides:
        if not any(key in _accepted(method_plugin(spec.method)) for spec in labels.values()):
            _fail(f"tuning.overrides.{key}", "no tuned method accepts it", source)
    try:
        validation = validate_config(_validation_raw(raw, block, config, labels, settings, overrides), None)
    except ConfigError as err:
        _fail("tuning.validation", f"its validation cells' config is refused: {err} (there `benchmarks` is "
              "tuning.validation, `retain` tuning.retain)", source)
    if rule == "forget_quality_at_utility" and not any(
            benchmark_plugin(bench).has_oracle and model.retain for bench in validation.benchmarks
            for model in validation.models):
        _fail("tuning.rule", "forget_quality_at_utility reads Forget Quality against the validation unit's oracle: "
              "give a validation benchmark with an oracle and its `tuning.retain`", source)
    _check_disjoint(config, validation, source)
    _check_taught(config, validation, source)
    spec = TuningSpec(rule, ratio, settings, sources, {}, validation)
    return dataclasses.replace(spec, budgets=_check_budgets(spec, labels, source))


def validate_with_tuning(raw: Any, source: str | None = None) -> ExperimentConfig:
    """`runner.config.validate_config` with its `tuning:` block checked and resolved (a `TuningSpec`)."""
    config, raw = validated(raw, source)
    if raw.get("tuning") is None:
        return config
    return dataclasses.replace(config, tuning=validate_tuning(raw, config, source))


def load_with_tuning(path, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """`runner.config.load_config` with its `tuning:` block checked and resolved: how a run reads its config."""
    return validate_with_tuning(*read_config_file(path, overrides))


def check_resolved(config: ExperimentConfig) -> None:
    """A config read by `validate_config` alone has its `tuning:` as written: planning it would skip the tuning."""
    if config.tuning is not None and not isinstance(config.tuning, TuningSpec):
        raise TypeError("this config's `tuning:` was not resolved: read it with runner.tuning.validate_with_tuning "
                        "or load_with_tuning")


def _accepted(plugin) -> set[str]:
    return set(plugin.hparams()) | set(plugin.aliases)


def _tuned_labels(block: dict, config: ExperimentConfig, source: str | None) -> dict:
    """{label: MethodSpec} of the entries tuned: `tuning.methods`, else every entry whose method has a default grid."""
    by_label: dict[str, Any] = {}
    for spec in config.methods:
        by_label.setdefault(spec.label, spec)
    named = block.get("methods")
    if named is None:
        return {label: spec for label, spec in by_label.items()
                if method_plugin(spec.method).tuning_grid and method_plugin(spec.method).trains}
    if not isinstance(named, list) or not named or not all(isinstance(n, str) for n in named):
        _fail("tuning.methods", f"expected a non-empty list of method labels, got {named!r}", source)
    for i, label in enumerate(named):
        if label not in by_label:
            _fail(f"tuning.methods[{i}]", f"{label!r} is no method label of this config; its labels: "
                  f"{', '.join(by_label)}", source)
        plugin = method_plugin(by_label[label].method)
        if not (plugin.trains and plugin.seeded):
            _fail(f"tuning.methods[{i}]", f"{plugin.name} trains nothing: it has no setting to tune", source)
    if len(set(named)) != len(named):
        _fail("tuning.methods", f"repeats a label: {named}", source)
    return {label: by_label[label] for label in named}


def _validation_raw(raw: dict, block: dict, config: ExperimentConfig, labels: dict, settings: dict,
                    overrides: dict) -> dict:
    """The validation cells' config: the run's own, with the validation units as its benchmarks, the validation
    oracle as each model's, one entry per (tuned label, setting), no attacks, the Original included."""
    val = {key: copy.deepcopy(value) for key, value in raw.items()
           if key not in ("tuning", "attacks", "report", "description", "include_original")}
    if isinstance(val.get("evaluation"), dict):   # a diagnostic no rule reads: not paid for on every setting
        val["evaluation"].pop("logit_lens", None)
    val["benchmarks"] = copy.deepcopy(block["validation"])
    val["seeds"] = copy.deepcopy(block.get("seeds", [config.seeds[0]]))
    benches = list(block["validation"]) if isinstance(block["validation"], dict) else []
    models = []
    for entry in raw["models"]:
        entry = {"path": entry} if isinstance(entry, str) else dict(entry)
        entry["benchmarks"] = benches
        entry.pop("retain", None)
        if block.get("retain") is not None:
            entry["retain"] = copy.deepcopy(block["retain"])
        models.append(entry)
    val["models"] = models
    methods = []
    for label, spec in labels.items():
        plugin = method_plugin(spec.method)
        accepted = _accepted(plugin)
        fixed = {key: value for key, value in overrides.items() if key in accepted}
        for setting in settings[label]:
            given = {plugin.aliases.get(key, key) for key in (*setting, *fixed)}
            entry = {key: value for key, value in _entry(raw, spec.index).items()
                     if key not in ("benchmarks", "overrides", "label") and plugin.aliases.get(key, key) not in given}
            methods.append({**entry, **fixed, **setting, "label": setting_label(label, setting)})
    val["methods"] = methods
    return val


def _unit_name(bench: str, split, target) -> str:
    return f"{bench} {benchmark_plugin(bench).unit_label(split, target)}"


def _describe_rows(shared: frozenset) -> str:
    """`rows 3960-3999 of TOFU full` for (what they index, row) items; else their count."""
    if all(isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], int) for item in shared):
        spaces = sorted({str(item[0]) for item in shared})
        rows = sorted(item[1] for item in shared)
        return f"rows {rows[0]}-{rows[-1]} of {' / '.join(spaces)}"
    return f"{len(shared)} item(s)"


def _check_disjoint(config: ExperimentConfig, validation: ExperimentConfig, source: str | None) -> None:
    """Refuse a validation unit (its forget items, and its training corpora) sharing an item with a reported unit of
    the same dataset (`Benchmark.data`); where either does not declare its items, one of the same benchmark must be
    another unit, and one of another benchmark on the same dataset is refused (nothing tells what they share)."""
    reported = [(bench, split, target, benchmark_plugin(bench).unit_items(split, target))
                for bench, block in config.benchmarks.items()
                for split, target in benchmark_plugin(bench).units(block)]
    for bench, block in validation.benchmarks.items():
        plugin = benchmark_plugin(bench)
        for split, target in plugin.units(block):
            own = plugin.unit_items(split, target)
            corpora = {key: plugin.fill(block[key], split, target) for key in ("forget_corpus", "retain_corpus")}
            for r_bench, r_split, r_target, theirs in reported:
                where = f"tuning.validation.{bench}"
                theirs_data = benchmark_plugin(r_bench).data
                if plugin.data is not None and theirs_data is not None and plugin.data != theirs_data:
                    continue   # two datasets (TOFU's authors, RWKU's people) share no item
                if own is None or theirs is None:
                    if r_bench == bench and (split, target) == (r_split, r_target):
                        _fail(where, f"{_unit_name(bench, split, target)} is a reported unit", source)
                    if r_bench != bench:
                        _fail(where, f"cannot tell whether {_unit_name(bench, split, target)} shares items with the "
                              f"reported {_unit_name(r_bench, r_split, r_target)} (neither benchmark declares its "
                              "items): validate on a unit of a reported benchmark", source)
                    continue
                for what, items in (("evaluates", own), *((f"trains on ({key} {value!r})",
                                                           plugin.corpus_items(value) or frozenset())
                                                          for key, value in corpora.items())):
                    if shared := items & theirs:
                        _fail(where, f"{_unit_name(bench, split, target)} {what} {_describe_rows(shared)}, which the "
                              f"reported {_unit_name(r_bench, r_split, r_target)} evaluates: a validation unit must "
                              "share no item with a reported one", source)


def _check_taught(config: ExperimentConfig, validation: ExperimentConfig, source: str | None) -> None:
    """A fine-tuned model must have learned what its validation cells make it forget."""
    for i, model in enumerate(config.models):
        if model.finetune is None:
            continue
        data = model.finetune["data"]
        for bench, block in validation.benchmarks.items():
            plugin = benchmark_plugin(bench)
            taught = plugin.corpus_items(data)
            for split, target in plugin.units(block):
                own = plugin.unit_items(split, target)
                if taught is not None and own is not None and not own <= taught:
                    _fail(f"models[{i}].finetune.data", f"{data!r} does not teach the validation unit "
                          f"{_unit_name(bench, split, target)} ({len(own - taught)} of its {len(own)} items): tuning "
                          "must make the model forget what it learned; add them to the fine-tune", source)


def setting_steps(cell) -> int | Fraction:
    """A validation cell's training steps: epochs x batches of its forget corpus (rows known without data, e.g. TOFU),
    else epochs / batch (the steps per forget row)."""
    plugin = method_plugin(cell.method)
    values = {key: value for key, value in cell.hparams.items() if key not in plugin.runner_fields}
    settings = plugin.config.preset(cell.benchmark, cell.split, **values) if hasattr(plugin.config, "preset") \
        else plugin.config(**values)
    epochs = getattr(settings, "num_epochs", None) or getattr(settings, "epochs")
    batch = getattr(settings, "effective_batch_size", None) or getattr(settings, "batch_size")
    items = benchmark_plugin(cell.benchmark).corpus_items(cell.corpora.get("forget_corpus", ""))
    return epochs * math.ceil(len(items) / batch) if items else Fraction(epochs) / batch


def _check_budgets(spec: TuningSpec, labels: dict, source: str | None) -> dict[str, str]:
    """Refuse grids that give the tuned entries unequal budgets (per validation unit, the sum of each setting's
    steps); returns each label's budget, written out."""
    cells = [cell for cell in build_plan(spec.validation) if cell.kind == "method"]
    seed = spec.validation.seeds[0]
    texts: dict[str, str] = {}
    for unit in dict.fromkeys(cell.group_key() for cell in cells):
        budgets: dict[str, Any] = {}
        for label, settings in spec.settings.items():
            wanted = {setting_label(label, setting) for setting in settings}
            try:
                steps = [setting_steps(cell) for cell in cells
                         if cell.group_key() == unit and cell.label in wanted and cell.seed in (seed, None)]
            except (InputError, TypeError, ValueError) as err:
                _fail(f"tuning.grids.{label}", f"its settings cannot be trained: {err}", source)
            budgets[label] = sum(steps)
            per = "forget row" if any(isinstance(s, Fraction) for s in steps) else None
            shown = " + ".join(str(s) for s in steps)
            texts[label] = (f"{len(steps)} settings, {shown} = {sum(steps)} steps" +
                            (f" per {per}" if per else ""))
        if len(set(budgets.values())) > 1:
            listed = "; ".join(f"{label} {texts[label]}" for label in budgets)
            _fail("tuning.grids", f"unequal budgets on {unit[1]} {unit[2]} (grid size x steps): {listed}; give every "
                  "tuned entry the same total steps", source)
    return texts


# -- choosing -------------------------------------------------------------------------------------------------------

def choose(rows: list[dict[str, Any]], original_utility: float, rule: str, ratio: float) -> tuple[int, str]:
    """The index of the setting `rule` picks from its rows (`forgetting`, `utility`, `forget_quality`: means over the
    validation cells; None where a cell failed) and why. A pure function of the scores."""
    if rule not in RULES:
        raise ValueError(f"unknown tuning rule {rule!r}")
    key = "forget_quality" if rule == "forget_quality_at_utility" else "forgetting"
    scored = [i for i, row in enumerate(rows) if is_number(row.get(key)) and is_number(row.get("utility"))]
    if not scored:
        raise InputError(f"tuning: no setting has both a {key} and a utility score; nothing to choose from")
    if not is_number(original_utility):
        raise InputError("tuning: the validation unit's Original has no utility score; the rule cannot be applied")
    floor = ratio * original_utility
    qualified = [i for i in scored if rows[i]["utility"] >= floor]
    if qualified:   # max keeps the first of equal values: ties go to the earlier setting
        best = max(qualified, key=lambda i: rows[i][key])
        return best, f"{len(qualified)} of {len(rows)} settings keep utility >= {ratio:g} x {original_utility:.4g}; " \
                     f"the highest {key.replace('_', ' ')}"
    return max(scored, key=lambda i: rows[i]["utility"]), FALLBACK


def _mean(values: list) -> float | None:
    values = [v for v in values if is_number(v)]
    return sum(values) / len(values) if values else None


def _scores(result: dict | None) -> dict[str, Any]:
    if result is None or result.get("status") != "ok":
        return {"forgetting": None, "utility": None, "forget_quality": None}
    plugin = benchmark_plugin(result["benchmark"])
    metrics = result.get("metrics") or {}
    forgetting, utility = plugin.forgetting_utility(metrics)
    return {"forgetting": forgetting, "utility": utility, "forget_quality": metrics.get("forget_quality")}


def decide(config: ExperimentConfig, cells: list, load: Callable[[str], dict | None]) -> dict | None:
    """The tuning record of `config`'s model from its validation `cells`' results (`load(hash)`), or None while one
    of them has no result. Every cell's scores, each setting's means, the rule's choice and its reason."""
    spec: TuningSpec = config.tuning
    results = {cell.hash: load(cell.hash) for cell in cells if cell.kind in ("method", "original")}
    if any(result is None for result in results.values()):
        return None
    originals = [cell for cell in cells if cell.kind == "original"]
    original_utility = _mean([_scores(results[cell.hash])["utility"] for cell in originals])
    bench = next(iter(spec.validation.benchmarks))
    record: dict[str, Any] = {
        "schema": RECORD_SCHEMA, "model": config.models[0].name, "rule": spec.rule, "rule_text": RULES[spec.rule],
        "fallback": FALLBACK, "ties": TIES, "utility_ratio": spec.ratio,
        "axes": list(benchmark_plugin(bench).axis_labels),
        "units": list(dict.fromkeys(f"{c.benchmark} {c.unit}" for c in originals)),
        "seeds": list(spec.validation.seeds),
        "original": {"utility": original_utility, "cells": [c.hash for c in originals]}, "methods": {}}
    for label, settings in spec.settings.items():
        rows = []
        for setting in settings:
            name = setting_label(label, setting)
            own = [cell for cell in cells if cell.label == name]
            per_cell = [{"hash": c.hash, "unit": f"{c.benchmark} {c.unit}", "seed": c.seed,
                         "status": results[c.hash].get("status"), **_scores(results[c.hash])} for c in own]
            failed = any(row["status"] != "ok" for row in per_cell)
            rows.append({"setting": setting, "label": name, "cells": per_cell,
                         **{key: None if failed else _mean([row[key] for row in per_cell])
                            for key in ("forgetting", "utility", "forget_quality")}})
        index, reason = choose(rows, original_utility, spec.rule, spec.ratio)
        floor = spec.ratio * original_utility
        for row in rows:
            row["qualifies"] = is_number(row["utility"]) and row["utility"] >= floor
        record["methods"][label] = {"method": next(m.method for m in config.methods if m.label == label),
                                    "source": spec.sources[label], "budget": spec.budgets.get(label, ""),
                                    "settings": rows, "chosen": settings[index], "chosen_index": index,
                                    "reason": reason}
    return record


def apply(config: ExperimentConfig, record: dict | None) -> ExperimentConfig:
    """`config` with each tuned entry at its chosen setting (its cells' `extra.tuning` saying how it was chosen);
    without a record (a dry run before the validation cells ran) the tuned entries are left out of the plan."""
    spec: TuningSpec = config.tuning
    methods = []
    for method in config.methods:
        if method.label not in spec.settings:
            methods.append(method)
        elif record is not None:
            choice = record["methods"][method.label]
            hashes = sorted([*record["original"]["cells"],
                             *(cell["hash"] for row in choice["settings"] for cell in row["cells"])])
            methods.append(dataclasses.replace(
                method, hparams={**method.hparams, **choice["chosen"]},
                tuning={"rule": spec.rule, "utility_ratio": spec.ratio, "grid": spec.settings[method.label],
                        "chosen": choice["chosen"], "validation_cells": hashes}))
    return dataclasses.replace(config, methods=tuple(methods))


def validation_cells(config: ExperimentConfig, finetunes: list) -> list:
    """The validation cells (the run's own fine-tune cells replace the validation plan's: one model), settled again
    against them, so that each starts from the run's fine-tune rather than from the validation plan's own, which is
    not run."""
    from .plan import settle

    return settle([*finetunes, *(cell for cell in build_plan(config.tuning.validation) if cell.kind != "finetune")])


def run_tuning(config: ExperimentConfig, *, dry_run: bool, executor=None, new_executor=None, inputs=None,
               force: bool = False, log: Callable[[str], None] = print) -> tuple[ExperimentConfig, list, dict | None]:
    """Run (unless `dry_run`) the validation cells, choose, save the record; returns the config to plan (tuned
    entries at their choice, or left out while no choice exists), the validation cells and the record. The cells
    run on `executor`, else on `new_executor(store, cells, log=log)` (`runner.cli` gives `execute.PlanExecutor`)."""
    from ..store import CellStore, atomic_write_json

    untuned = dataclasses.replace(config, methods=tuple(m for m in config.methods if m.label not in
                                                        config.tuning.settings))
    finetunes = [cell for cell in build_plan(untuned) if cell.kind == "finetune"]
    cells = validation_cells(config, finetunes)
    store = CellStore(config.output_dir, log=log)
    if not dry_run:
        from .loop import run_cells

        if executor is None:
            from .provenance import cell_inputs

            if new_executor is None:
                raise TypeError("run_tuning: give an executor or new_executor to run the validation cells")
            executor, inputs = new_executor(store, cells, log=log), inputs or cell_inputs
        store.root.mkdir(parents=True, exist_ok=True)
        log(f"tuning: {len(cells)} validation cells first ({config.tuning.rule})")
        run_cells(cells, store, executor, log=log, force=force, **({"inputs": inputs} if inputs else {}))
    record = decide(config, cells, lambda cell_hash: store.load_result(cell_hash, quiet=True))
    if record is not None and not dry_run:
        atomic_write_json(store.root / TUNING_DIR / f"{record['model']}.json", record)
        for label, choice in record["methods"].items():
            log(f"tuning: {label} -> {choice['chosen']} ({choice['reason']})")
    return apply(config, record), [cell for cell in cells if cell.kind != "finetune"], record
