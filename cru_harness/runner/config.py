"""Experiment configs: the YAML schema, its validation, and the resolved form the planner reads.

An experiment is a config (open-unlearning style). Every error names the offending key as a path
(`methods[2].lr`, `benchmarks.rwku.targets`), so a typo never silently becomes a default.
The schema is documented key by key in `SCHEMA` below and in `docs/results_schema.md`.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..devices import DTYPE_NAMES
from ..reporting.settings import configured_methods, report_settings  # noqa: F401  (importable here)
from ..validation import MAX_MESSAGE, ConfigChecker, ConfigError, excerpt  # noqa: F401  (importable here)
from ..validation import _boolean, _check_keys, _fail, _number, _str_list, _suggest  # noqa: F401
from ..hparams import (HPARAM_BOUNDS, HPARAM_CHOICES, MAX_BATCH, MAX_ROWS, adam_betas_problem,  # noqa: F401
                       bound_problem, check_seed, fields_problem, seed_problem)
from ..api import SettingError
from ..errors import InputError, MissingInputError
from ..prompts import PresetError
from .schema import (ExperimentFile, Finetune, MethodEntry, ModelEntry, Retain, RetainTrain, allowed_keys,
                     check_keys, check_values)

# What each method accepts, its aliases, benchmarks and per-benchmark settings are its plugin's
# (`cru_harness.api.Method`, registered under `cru_harness.methods`): this module holds no copy of them.


def _benchmark_names() -> list[str]:
    from .. import plugins

    return plugins.benchmarks.names()


def benchmark_plugin(name):
    """The registered benchmark plugin of a name (`cru_harness.plugins.benchmarks`)."""
    from .. import plugins

    return plugins.benchmarks.get(name)


def _method_names() -> list[str]:
    from .. import plugins

    return plugins.methods.names()


def canonical_method(name) -> str | None:
    """A method's canonical name (`ga` -> `GA`), None for an unknown one."""
    from .. import plugins

    return plugins.methods.canonical(name)


def method_plugin(name):
    """The registered method plugin of a canonical name (`cru_harness.plugins.methods`)."""
    from .. import plugins

    return plugins.methods.get(name)


def __getattr__(name: str):
    if name == "PROMPTING_DEFAULTS":   # `prompting_defaults()`
        return prompting_defaults()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default_benchmarks(method: str, benchmarks) -> list[str]:
    """The configured benchmarks a method entry without `benchmarks:` runs on: those the method supports."""
    plugin = method_plugin(method)
    return [bench for bench in benchmarks if plugin.unsupported(bench) is None]



# The blocks' keys are declared once, in `schema` (pydantic, extra="forbid"); these are views of them.
_METHOD_ENTRY_KEYS = allowed_keys(MethodEntry)
_TOP_KEYS = allowed_keys(ExperimentFile)
_MODEL_KEYS = allowed_keys(ModelEntry)
_RETAIN_KINDS = allowed_keys(Retain)
# `finetune:` (a model's, or its retain oracle's): TOFU's recipe (cru_harness.finetune) with these overrides.
_FINETUNE_KEYS = allowed_keys(Finetune)
_FINETUNE_ALIASES = {"lr": "learning_rate", "epochs": "num_epochs", "batch_size": "effective_batch_size"}
_RETAIN_TRAIN_KEYS = allowed_keys(RetainTrain)
#: The `evaluation:` keys of every run; each benchmark adds its own (`Benchmark.evaluation_defaults`).
_GENERIC_EVAL_KEYS = ("batch_size", "limit", "max_gen_toks", "failure_classes", "apply_chat_template")
_LAST_EVAL_KEYS = ("logit_lens",)


def evaluation_keys() -> tuple[str, ...]:
    """Every key an `evaluation:` block may set: the generic ones and each registered benchmark's."""
    own = [key for plugin in _benchmark_plugins() for key in plugin.evaluation_defaults]
    return tuple(dict.fromkeys([*_GENERIC_EVAL_KEYS, *own, *_LAST_EVAL_KEYS]))


def _benchmark_plugins():
    from .. import plugins

    return list(plugins.benchmarks)


def prompting_defaults(benchmarks=()) -> dict[str, Any]:
    """The evaluation settings that decide how prompts are written, with their defaults: the one place for them
    (validation fills them in; the cells' presets and the finetune cell read them from here). The chat choice, the
    keys of every benchmark whose defaults are in every cell (`Benchmark.evaluation_in_every_cell`: the built-ins,
    whose recorded hashes hold them), and those of `benchmarks` (a config's)."""
    named = {str(b).lower() for b in benchmarks}
    defaults: dict[str, Any] = {"apply_chat_template": None}
    for plugin in _benchmark_plugins():
        if plugin.evaluation_in_every_cell or plugin.name.lower() in named:
            defaults.update(plugin.evaluation_defaults)
    return defaults


@dataclass(frozen=True)
class RetainSpec:
    """How the TOFU retain (oracle) model of one (model, split) is obtained."""
    kind: str                      # checkpoint | per_item | train
    value: Any                     # path/id, per-item file, or the training dict

    def to_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: str
    dtype: str = "auto"
    benchmarks: tuple[str, ...] = ()          # the configured benchmarks it runs
    retain: dict[str, RetainSpec] = field(default_factory=dict)  # split -> spec
    chat_template: bool | None = None
    trust_remote_code: bool = False
    # Dtype per phase: `dtype` loads and trains (baselines, CRU's frozen base), `eval_dtype` scores (None =
    # `dtype`), `finetune.dtype` fine-tunes.
    eval_dtype: str | None = None
    device_map: str | None = None             # "auto": shard over the visible GPUs (not part of the identity)
    finetune: dict[str, Any] | None = None    # fine-tune `path` first with TOFU's recipe (a cell of its own)

    def identity(self) -> dict:
        """What makes two model specs the same model (used in cell hashes). Where a model runs (device_map)
        does not change what it is; `finetune` is only recorded when set, so older hashes stay valid."""
        identity = {"name": self.name, "path": self.path, "dtype": self.dtype, "chat_template": self.chat_template,
                    "trust_remote_code": self.trust_remote_code, "eval_dtype": self.eval_dtype}
        if self.finetune is not None:
            identity["finetune"] = self.finetune
        return identity


@dataclass(frozen=True)
class MethodSpec:
    method: str                    # canonical name: GA, GD, NPO, SimNPO, IdkDPO, CRU, ICU, PURGE
    label: str                     # row name in tables (unique per benchmark)
    hparams: dict[str, Any]
    benchmarks: tuple[str, ...]
    overrides: dict[str, dict[str, Any]]  # benchmark or split name -> hparams
    corpora: dict[str, str]        # forget_corpus / retain_corpus overrides
    index: int                     # position in `methods` (for error messages)
    settings: dict[str, Any] = field(default_factory=dict)   # its method's `entry_settings` (PURGE's checkpoints)
    as_computed: dict[str, Any] = field(default_factory=dict)   # former defaults restated: trained, not hashed
    tuning: dict[str, Any] | None = None   # set by `runner.tuning` once its rule chose: in its cells' `extra`

    def hparams_for(self, benchmark: str, split: str | None) -> dict[str, Any]:
        resolved = dict(self.hparams)
        for selector in (benchmark, split):
            if selector and selector in self.overrides:
                resolved.update(self.overrides[selector])
        return resolved


@dataclass(frozen=True)
class AttackSpec:
    """An `attacks:` entry: a registered attack (`cru_harness.plugins.attacks`), applied to every method cell."""
    attack: str                    # the registered name
    label: str                     # appended to the attacked row's label
    settings: dict[str, Any]
    index: int


@dataclass(frozen=True)
class ExperimentConfig:
    name: str
    output_dir: Path
    data_dir: str | None
    seeds: tuple[int, ...]
    device: str
    include_original: bool
    models: tuple[ModelSpec, ...]
    benchmarks: dict[str, dict[str, Any]]   # resolved: tofu.splits list, rwku.targets list of ints, tasks, ...
    methods: tuple[MethodSpec, ...]
    evaluation: dict[str, Any]
    report: dict[str, Any]
    raw: dict[str, Any]
    source: str | None = None
    attacks: tuple["AttackSpec", ...] = ()
    training: dict[str, Any] = field(default_factory=dict)   # `training:`: the engine (`training.launch`)
    # `tuning:` resolved (`runner.tuning.TuningSpec`) by `runner.tuning.validate_with_tuning`; the raw mapping as
    # `validate_config` leaves it (such a config is read through `validate_with_tuning` to run); None without it
    tuning: Any = None


def config_path(path: str | os.PathLike) -> Path:
    """`path` as given when it exists; else, for a relative `configs/...` path (the README's commands, typed
    outside a checkout), the config the package ships under that name (`cru_harness.configs`)."""
    path = Path(path)
    if path.exists() or path.is_absolute() or len(path.parts) < 2 or path.parts[0] != "configs":
        return path
    import importlib.resources

    try:
        packaged = Path(str(importlib.resources.files("cru_harness.configs"))).joinpath(*path.parts[1:])
    except ModuleNotFoundError:   # a source tree without configs/ shadows the installed package
        return path
    return packaged if packaged.is_file() else path


def load_config(path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Read and validate a YAML config (`config_path`: `configs/...` also names a shipped one). Relative
    `output_dir`/`data_dir` are relative to the working directory. `tuning:` as `validate_config` leaves it."""
    return validate_config(*read_config_file(path, overrides))


def read_config_file(path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> tuple[Any, str]:
    """A YAML config's parsed contents (with `overrides`) and the name to cite it by, for `validate_config`."""
    given, path = str(path), config_path(path)
    if path.is_dir():
        raise MissingInputError(f"{path} is a directory, not a config file (a YAML file such as configs/demo.yaml)")
    if not path.is_file():
        raise MissingInputError(f"config file not found: {path}")
    from ..yamlfile import read_yaml

    raw = read_yaml(path)   # bounded: size, encoding, nesting, aliases (ConfigError naming the file)
    if overrides and (raw is None or isinstance(raw, dict)):  # anything else is refused by validate_config
        raw = {**(raw or {}), **overrides}
    return raw, given


def _placeholders(text: str) -> list[str]:
    """The `{name}` placeholders of a template, in order."""
    return re.findall(r"\{([^{}]*)\}", text)


def _check_placeholders(text: str, bench: str, key: str, source: str | None) -> None:
    available = benchmark_plugin(bench).placeholders
    for name in _placeholders(text):
        if name not in available:
            _fail(key, f"placeholder {{{name}}} is not filled on {bench}; available: "
                  f"{', '.join('{' + p + '}' for p in available)}", source)


_BOOLEAN_HPARAMS = ("prefix_cache",)


def _as_computed(method: str, values, hparams: dict, where: str, source: str | None) -> dict:
    """A committed run's `as_computed:` block: defaults its cells were computed with before they changed, restated
    so they still train them while staying out of the cells' hashes (which predate them). Each must be one of the
    method's `former_defaults`, at that value: the block restores a former computation and can set nothing else."""
    if values is None:
        return {}
    if not isinstance(values, dict) or not values:
        _fail(where, "expected a mapping {hyperparameter: its former default}", source)
    resolved = _validate_hparams(method, values, where, source)
    former = method_plugin(method).former_defaults
    for key, value in resolved.items():
        if key in hparams:
            _fail(f"{where}.{key}", "is also set as a hyperparameter of the entry: give it once", source)
        if key not in former:
            _fail(f"{where}.{key}", f"{method} has no former default for {key} (restatable: "
                  f"{', '.join(sorted(former)) or 'none'})", source)
        if value != former[key]:
            _fail(f"{where}.{key}", f"{value!r} is not {method}'s former default {former[key]!r}: as_computed "
                  "restates what committed cells were computed with; set a new value as a hyperparameter", source)
    return resolved


def _validate_hparams(method: str, hparams: dict, where: str, source: str | None) -> dict:
    plugin = method_plugin(method)
    allowed = plugin.hparams()
    aliases = dict(plugin.aliases)
    resolved = {}
    for key, value in hparams.items():
        canon = aliases.get(key, key)
        path = f"{where}.{key}"
        if canon not in allowed:
            if reason := plugin.refuse_hparam(canon):
                _fail(path, reason, source)
            hint = _suggest(canon, allowed + tuple(aliases))
            _fail(path, f"not a hyperparameter of {method}{hint}; {method} accepts: "
                  f"{', '.join(allowed) or 'nothing'}", source)
        if canon in resolved:
            _fail(path, f"given twice (as {canon!r} and an alias)", source)
        if canon in HPARAM_BOUNDS:
            value = _number(value, path, source, **HPARAM_BOUNDS[canon])
        if canon == "adam_betas" and (problem := adam_betas_problem(value)):
            _fail(path, problem, source)
        if canon in _BOOLEAN_HPARAMS:
            value = _boolean(value, path, source)
        if canon in HPARAM_CHOICES and value not in HPARAM_CHOICES[canon]:
            _fail(path, f"expected one of {', '.join(HPARAM_CHOICES[canon])}, got {value!r}", source)
        resolved[canon] = value
    try:   # the method's dataclass has the last word (a field's own rule, a combination of fields)
        plugin.check_hparams(resolved)
    except (InputError, TypeError, ValueError) as err:
        _fail(where, f"{method}: {err}", source)
    return resolved


def validate_config(raw: Any, source: str | None = None) -> ExperimentConfig:
    """Validate a parsed config and resolve its defaults. Raises `ConfigError` naming the key. A `tuning:` block is
    left as written: `runner.tuning.validate_with_tuning` checks and resolves it (it plans validation cells)."""
    return validated(raw, source)[0]


def validated(raw: Any, source: str | None = None) -> tuple[ExperimentConfig, dict]:
    """`validate_config`'s config, and the mapping it read it from (moved keys moved: `_moved_keys`)."""
    if raw is None:
        _fail("<root>", "the config is empty", source)
    if not isinstance(raw, dict):
        _fail("", f"expected a mapping of settings (name, models, benchmarks, methods, ...) at the top level, "
              f"got a {type(raw).__name__}", source)
    original = copy.deepcopy(raw)   # the config as written (plan.json)
    raw = _moved_keys(copy.deepcopy(raw), source)
    check_keys(ExperimentFile, raw, "", source)
    for required in ("name", "models", "benchmarks", "methods"):
        if required not in raw:
            _fail(required, "is required", source)
    check_values(ExperimentFile, raw, "", source)   # name, output_dir, data_dir, seeds, include_original
    name = raw["name"]
    output_dir = Path(raw.get("output_dir") or Path("results") / name)
    data_dir = raw.get("data_dir")
    seeds = raw.get("seeds", [0])
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]

    from ..devices import DeviceError, check_device_spec

    device = raw.get("device", "auto")
    try:
        device = check_device_spec(device)
    except DeviceError as err:
        _fail("device", str(err), source)
    include_original = raw.get("include_original", True)

    # -- benchmarks
    benches_raw = _check_keys(raw["benchmarks"], tuple(_benchmark_names()), "benchmarks", source)
    if not benches_raw:
        _fail("benchmarks", f"names no benchmark ({' and/or '.join(_benchmark_names())})", source)
    benchmarks: dict[str, dict[str, Any]] = {}
    check = ConfigChecker(source)
    for bench, spec in benches_raw.items():
        where = f"benchmarks.{bench}"
        plugin = benchmark_plugin(bench)
        spec = _check_keys(spec or {}, plugin.config_keys, where, source)
        resolved: dict[str, Any] = dict(plugin.resolve_block(spec, where, check))
        tasks = _str_list(spec.get("tasks", list(plugin.default_tasks)), f"{where}.tasks", source)
        if not tasks:
            _fail(f"{where}.tasks", "is empty", source)
        for i, task in enumerate(tasks):
            _check_placeholders(task, bench, f"{where}.tasks[{i}]", source)
        resolved["tasks"] = tasks
        limit = spec.get("limit")
        if limit is not None:
            limit = _number(limit, f"{where}.limit", source, low=1, high=MAX_ROWS, integer=True)
        resolved["limit"] = limit
        for corpus_key in ("forget_corpus", "retain_corpus"):
            value = spec.get(corpus_key, plugin.default_corpora[corpus_key])
            if not isinstance(value, str):
                _fail(f"{where}.{corpus_key}", f"expected a corpus source string, got {value!r}", source)
            _check_placeholders(value, bench, f"{where}.{corpus_key}", source)
            resolved[corpus_key] = value
        bench_data = spec.get("data_dir", data_dir)
        if bench_data is not None and not isinstance(bench_data, str):
            _fail(f"{where}.data_dir", f"expected a path or testbed:world, got {bench_data!r}", source)
        if bench_data is not None and (problem := plugin.check_data_dir(bench_data)):
            _fail(f"{where}.data_dir", problem, source)
        resolved["data_dir"] = bench_data
        benchmarks[bench] = resolved

    # -- models
    models_raw = raw["models"]
    if not isinstance(models_raw, list) or not models_raw:
        _fail("models", "expected a non-empty list of models", source)
    models = []
    for i, entry in enumerate(models_raw):
        where = f"models[{i}]"
        if isinstance(entry, str):
            entry = {"path": entry}
        check_keys(ModelEntry, entry, where, source)
        if "path" not in entry or not isinstance(entry["path"], str) or not entry["path"]:
            _fail(f"{where}.path", "is required: a Hub id, a local directory, zoo:<arch>[:<variant>] or smollm2",
                  source)
        path = entry["path"]
        model_name = entry.get("name") or path.rstrip("/").split("/")[-1]
        if not isinstance(model_name, str) or not re.fullmatch(r"[A-Za-z0-9_.+-]+", model_name):
            _fail(f"{where}.name", f"expected a simple name, got {model_name!r}", source)
        if model_name in {m.name for m in models}:
            _fail(f"{where}.name", f"model name {model_name!r} is used twice", source)
        # dtype, eval_dtype, chat_template, trust_remote_code, device_map: their rules are declared (`ModelEntry`)
        check_values(ModelEntry, entry, where, source)
        dtype = entry.get("dtype", "auto")
        eval_dtype = entry.get("eval_dtype")
        model_benches = tuple(_str_list(entry.get("benchmarks", list(benchmarks)), f"{where}.benchmarks", source))
        for j, bench in enumerate(model_benches):
            if bench not in benchmarks:
                _fail(f"{where}.benchmarks[{j}]", f"benchmark {bench!r} is not configured under `benchmarks`",
                      source)
        retain = _validate_retain(entry.get("retain"), f"{where}.retain", benchmarks, model_benches, source)
        chat_template = entry.get("chat_template")
        trust_remote_code = entry.get("trust_remote_code", False)
        device_map = entry.get("device_map")
        finetune = entry.get("finetune")
        if finetune is not None:
            finetune = _validate_finetune(finetune, f"{where}.finetune", source, needs_data=True)
            if any(benchmarks[b].get("select_known") for b in model_benches):
                _fail(f"{where}.finetune", "RWKU select_known ranks targets on the model as given, before any "
                      "fine-tuning; use a separate model entry for RWKU", source)
        models.append(ModelSpec(model_name, path, dtype, model_benches, retain, chat_template,
                                trust_remote_code, eval_dtype, device_map, finetune))

    # -- methods
    methods_raw = raw["methods"]
    if not isinstance(methods_raw, list) or not methods_raw:
        _fail("methods", "expected a non-empty list of methods", source)
    methods: list[MethodSpec] = []
    for i, entry in enumerate(methods_raw):
        where = f"methods[{i}]"
        if isinstance(entry, str):
            entry = {"method": entry}
        if not isinstance(entry, dict):
            _fail(where, f"expected a mapping with at least `method`, got {entry!r}", source)
        if "method" not in entry:
            _fail(f"{where}.method", f"is required (one of {', '.join(_method_names())})", source)
        method = canonical_method(entry["method"])
        if method is None:
            _fail(f"{where}.method", f"unknown method {entry['method']!r}; known: {', '.join(_method_names())}",
                  source)
        plugin = method_plugin(method)
        label = entry.get("label", method)
        if not isinstance(label, str) or not label or label.lower() in ("original", "retain"):
            _fail(f"{where}.label", f"expected a row name other than Original/Retain, got {label!r}", source)
        method_benches = _str_list(entry.get("benchmarks", default_benchmarks(method, benchmarks)),
                                   f"{where}.benchmarks", source)
        for j, bench in enumerate(method_benches):
            if bench not in benchmarks:
                _fail(f"{where}.benchmarks[{j}]", f"benchmark {bench!r} is not configured under `benchmarks`",
                      source)
            if reason := plugin.unsupported(bench):
                _fail(f"{where}.benchmarks[{j}]" if "benchmarks" in entry else f"{where}.method", reason, source)
        if not method_benches:
            _fail(f"{where}.method", plugin.unsupported(next(iter(benchmarks))), source)
        try:   # settings of the entry that are not hyperparameters (PURGE's checkpoints)
            settings = plugin.read_settings({k: entry[k] for k in plugin.entry_settings if k in entry})
        except SettingError as err:
            _fail(f"{where}.{err.key}", err.message, source)
        hparam_items = {k: v for k, v in entry.items() if k not in _METHOD_ENTRY_KEYS
                        and k not in plugin.entry_settings}
        hparams = _validate_hparams(method, hparam_items, where, source)
        as_computed = _as_computed(method, entry.get("as_computed"), hparams, f"{where}.as_computed", source)
        overrides_raw = entry.get("overrides") or {}
        if not isinstance(overrides_raw, dict):
            _fail(f"{where}.overrides", "expected a mapping {benchmark or split: {hyperparameter: value}}", source)
        overrides = {}
        selectors = set(method_benches) | {split for block in benchmarks.values() for split in block.get("splits", [])}
        for selector, values in overrides_raw.items():
            if selector not in selectors:
                _fail(f"{where}.overrides.{selector}", f"selects nothing: expected one of {sorted(selectors)}",
                      source)
            if not isinstance(values, dict):
                _fail(f"{where}.overrides.{selector}", "expected a mapping of hyperparameters", source)
            overrides[selector] = _validate_hparams(method, values, f"{where}.overrides.{selector}", source)
        corpora = {}
        for corpus_key in ("forget_corpus", "retain_corpus"):
            if corpus_key in entry:
                if not plugin.reads_corpora:
                    _fail(f"{where}.{corpus_key}", f"{method} trains nothing, so it reads no corpus", source)
                if not isinstance(entry[corpus_key], str):
                    _fail(f"{where}.{corpus_key}", "expected a corpus source string", source)
                for bench in method_benches:
                    _check_placeholders(entry[corpus_key], bench, f"{where}.{corpus_key}", source)
                corpora[corpus_key] = entry[corpus_key]
        for other in methods:
            if other.label == label and set(other.benchmarks) & set(method_benches):
                _fail(f"{where}.label", f"label {label!r} is already used by methods[{other.index}] on "
                      f"{sorted(set(other.benchmarks) & set(method_benches))}; give one a distinct `label`", source)
        if problem := plugin.check_config(SimpleNamespace(benchmarks=benchmarks, models=models, settings=settings),
                                          where):
            _fail(*problem, source)
        methods.append(MethodSpec(method, label, hparams, tuple(method_benches), overrides, corpora, i, settings,
                                  as_computed))

    evaluation = _check_keys(raw.get("evaluation") or {}, evaluation_keys(), "evaluation", source)
    defaults = prompting_defaults(benchmarks)
    evaluation = {"batch_size": 8, "limit": None, "max_gen_toks": None, "failure_classes": True,
                  **defaults, **evaluation}
    for key, default in defaults.items():   # an empty value means the default, as the tasks read it
        if evaluation[key] is None or evaluation[key] == "":
            evaluation[key] = default
    try:  # protocol presets (cru_harness.prompts): an unknown name or model family fails here, naming the choices
        for plugin in _benchmark_plugins():   # each benchmark's own keys, wherever they are set
            if set(plugin.evaluation_defaults) & set(evaluation):
                plugin.check_presets(evaluation)
        for bench in benchmarks:   # e.g. TOFU: the model family its preset names
            benchmark_plugin(bench).check_evaluation(evaluation)
    except PresetError as err:
        _fail("evaluation", str(err), source)
    _number(evaluation["batch_size"], "evaluation.batch_size", source, low=1, high=MAX_BATCH,
            integer=True)
    if evaluation["limit"] is not None:
        _number(evaluation["limit"], "evaluation.limit", source, low=1, high=MAX_ROWS, integer=True)
    _boolean(evaluation["failure_classes"], "evaluation.failure_classes", source)
    _boolean(evaluation["apply_chat_template"], "evaluation.apply_chat_template", source, allow_none=True)
    # off unless asked for, and then absent from the cells: a config without it keeps its cells' hashes
    if _boolean(evaluation.pop("logit_lens", False), "evaluation.logit_lens", source):
        evaluation["logit_lens"] = True
    report = report_settings(raw.get("report"), source)
    attacks = _validate_attacks(raw.get("attacks"), source)
    _check_tasks_under_presets(benchmarks, benches_raw, attacks, evaluation, source)

    training = _validate_training(raw.get("training"), source)
    config = ExperimentConfig(name=name, output_dir=output_dir, data_dir=data_dir, seeds=tuple(seeds),
                              device=device, include_original=include_original, models=tuple(models),
                              benchmarks=benchmarks, methods=tuple(methods),
                              evaluation=evaluation, report=report, raw=original, source=source,
                              attacks=attacks, training=training)
    if raw.get("tuning") is not None:   # checked and resolved above this module (`runner.tuning.validate_with_tuning`):
        config = dataclasses.replace(config, tuning=raw["tuning"])   # it plans its validation cells (`runner.plan`)
    return config, raw


def _validate_training(raw: Any, source: str | None) -> dict[str, Any]:
    """`training: {engine, num_processes, config_file}` (`training.launch.LaunchSettings`): how weight-training
    cells run. Not in any cell's hash: an engine gives the same updates (`docs/gpu.md`)."""
    if raw is None:
        return {}
    from ..training.launch import LaunchSettings

    if not isinstance(raw, dict):
        _fail("training", "expected a mapping {engine, num_processes, config_file}", source)
    try:
        settings = LaunchSettings.from_dict(raw)
    except InputError as err:
        _fail("training", str(err), source)
    return dataclasses.asdict(settings)


def _moved_keys(raw: dict, source: str | None) -> dict:
    """A top-level key of an earlier config that is now a setting of a method's entry (`Method.moved_keys`, e.g.
    `purge_checkpoints` -> PURGE's `checkpoints`): moved into each entry of that method that does not set it, with
    a one-line note naming the new key."""
    import sys

    from .. import plugins

    entries = raw.get("methods") if isinstance(raw.get("methods"), list) else []
    for plugin in plugins.methods:
        for old, new in plugin.moved_keys.items():
            if old not in raw:
                continue
            value = raw.pop(old)
            mine = [i for i, e in enumerate(entries)
                    if canonical_method(e if isinstance(e, str) else e.get("method") if isinstance(e, dict)
                                        else None) == plugin.name]
            for i in mine:
                entry = entries[i] if isinstance(entries[i], dict) else {"method": entries[i]}
                entries[i] = {**entry, new: entry.get(new, value)}
            where = ", ".join(f"methods[{i}].{new}" for i in mine) or f"a {plugin.name} entry's `{new}`"
            print(f"note: {source or 'config'}: `{old}` is now {plugin.name}'s method entry key `{new}`; read as "
                  f"{where}", file=sys.stderr)
    return raw


def _check_tasks_under_presets(benchmarks: dict, raw: dict, attacks: tuple, evaluation: dict,
                               source: str | None) -> None:
    """Each benchmark's tasks, and its attacks' task variants, under the evaluation presets: a default task the
    presets cannot score is left out (TOFU's privacy task under the legacy preset); a named one fails here, not
    in every cell at run time."""
    from .. import plugins

    for bench, block in benchmarks.items():
        plugin = benchmark_plugin(bench)
        try:
            block["tasks"] = plugin.tasks_under(list(block["tasks"]), evaluation,
                                                defaulted="tasks" not in (raw[bench] or {}))
        except PresetError as err:
            _fail(f"benchmarks.{bench}.tasks", str(err), source)
        for attack in attacks:
            for split, target in plugin.units(block)[:1]:   # the variants' names do not depend on the unit
                tasks = tuple(plugin.fill(task, split, target) for task in block["tasks"])
                try:
                    plugin.tasks_under(list(plugins.attacks.get(attack.attack).tasks_for(plugin, tasks,
                                                                                       attack.settings)),
                                       evaluation, defaulted=False)
                except PresetError as err:
                    _fail(f"attacks[{attack.index}]", str(err), source)


def _validate_attacks(value: Any, source: str | None) -> tuple[AttackSpec, ...]:
    """`attacks: [identity, {attack: NAME, label: ..., <its settings>}]`: each a registered attack, evaluated on
    every method cell of the run as a cell of its own (kind `attack`)."""
    from .. import plugins
    from ..plugins import UnknownPluginError

    if value is None:
        return ()
    if not isinstance(value, list):
        _fail("attacks", "expected a list of attacks (names or {attack: NAME, ...})", source)
    specs: list[AttackSpec] = []
    for i, entry in enumerate(value):
        where = f"attacks[{i}]"
        entry = {"attack": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or "attack" not in entry:
            _fail(where, "expected an attack name or a mapping with `attack`", source)
        try:
            plugin = plugins.attacks.get(entry["attack"])
        except UnknownPluginError as err:
            _fail(f"{where}.attack", str(err), source)
        label = entry.get("label", plugin.name)
        if not isinstance(label, str) or not label:
            _fail(f"{where}.label", f"expected a non-empty name, got {label!r}", source)
        if label in {s.label for s in specs}:
            _fail(f"{where}.label", f"label {label!r} is used twice; give one a distinct `label`", source)
        settings = {k: v for k, v in entry.items() if k not in ("attack", "label")}
        allowed = plugin.settings()
        for key in settings:
            if key not in allowed:
                _fail(f"{where}.{key}", f"not a setting of attack {plugin.name}{_suggest(key, allowed)}; it accepts: "
                      f"{', '.join(allowed) or 'nothing'}", source)
        try:
            plugin.check_settings(settings)
        except (InputError, TypeError, ValueError) as err:
            _fail(where, f"{plugin.name}: {err}", source)
        specs.append(AttackSpec(plugin.name, label, settings, i))
    return tuple(specs)


def _validate_retain(value: Any, where: str, benchmarks: dict, model_benches: tuple[str, ...],
                     source: str | None) -> dict[str, RetainSpec]:
    """`retain:` is one spec for every split, or a mapping split -> spec; a spec has exactly one of
    checkpoint (path or Hub id), per_item (a saved per-item file from `cru-harness score`), train (a dict: the
    testbed's small loop), finetune (TOFU's recipe from the model's `path`; `data` defaults to the split's
    retain set)."""
    if value is None:
        return {}
    oracle = next((b for b in model_benches if benchmark_plugin(b).has_oracle), None)
    if oracle is None:
        having = [b for b in _benchmark_names() if benchmark_plugin(b).has_oracle]
        _fail(where, f"a retain model is the oracle of a benchmark that has one ({', '.join(having) or 'none'}), but "
              "this model runs none", source)
    kinds = benchmark_plugin(oracle).oracle_kinds or _RETAIN_KINDS
    unit = benchmark_plugin(oracle).name.upper()
    splits = benchmarks[oracle]["splits"]
    if not isinstance(value, dict):
        _fail(where, "expected {checkpoint: ...}, {per_item: ...}, {train: {...}} or a mapping per split", source)
    if set(value) & set(_RETAIN_KINDS):
        per_split = {split: value for split in splits}
        wheres = {split: where for split in splits}
    else:
        for key in value:
            if key not in splits:
                _fail(f"{where}.{key}", f"expected a retain spec kind ({', '.join(kinds)}) or a configured "
                      f"{unit} split ({', '.join(splits)})", source)
        per_split = value
        wheres = {split: f"{where}.{split}" for split in value}
    resolved = {}
    for split, spec in per_split.items():
        w = wheres[split]
        _check_keys(spec, kinds, w, source)
        if len(spec) != 1:
            _fail(w, f"give exactly one of {', '.join(kinds)}", source)
        (kind, val), = spec.items()
        if kind == "finetune":
            val = _validate_finetune(val or {}, f"{w}.finetune", source, needs_data=False)
            val.setdefault("data", "{retain_split}")
        elif kind == "train":
            val = dict(check_keys(RetainTrain, val or {}, f"{w}.train", source))
            for key in ("epochs", "lr", "batch_size", "max_length", "weight_decay"):
                if key in val:
                    val[key] = _number(val[key], f"{w}.train.{key}", source, **HPARAM_BOUNDS[key])
        elif not isinstance(val, str) or not val:
            _fail(f"{w}.{kind}", "expected a path", source)
        resolved[split] = RetainSpec(kind, val)
    return resolved


def _validate_finetune(value: Any, where: str, source: str | None, *, needs_data: bool) -> dict[str, Any]:
    """A `finetune:` mapping: `data` (a corpus source: TOFU config, JSON/JSONL file, rwku:...) and overrides of
    TOFU's recipe, aliases resolved (lr, epochs, batch_size), so the cell hash sees one spelling."""
    check_keys(Finetune, value, where, source)
    resolved: dict[str, Any] = {}
    for key, val in value.items():
        canon = _FINETUNE_ALIASES.get(key, key)
        if canon in resolved:
            _fail(f"{where}.{key}", f"given twice (as {canon} and an alias)", source)
        if canon == "data":
            if not isinstance(val, str) or not val:
                helps = [plugin.corpus_help for plugin in _benchmark_plugins() if plugin.corpus_help]
                _fail(f"{where}.data", f"expected a corpus source: a JSON/JSONL file, {', '.join(helps)}", source)
            if needs_data and (names := _placeholders(val)):
                # a model's own fine-tune is one cell for every split: nothing fills a placeholder there
                _fail(f"{where}.data", f"placeholder {{{names[0]}}} is filled only in a retain oracle's "
                      f"`finetune: data`; a model's fine-tune trains once, on one corpus", source)
            # TOFU's recipe: its data names the oracle benchmark's units (`{retain_split}`)
            oracle = next((b for b in _benchmark_names() if benchmark_plugin(b).has_oracle), None)
            if oracle is not None:
                _check_placeholders(val, oracle, f"{where}.data", source)
        elif canon == "dtype":
            if val not in DTYPE_NAMES:
                _fail(f"{where}.dtype", f"expected one of {', '.join(DTYPE_NAMES)}, got {val!r}", source)
        elif canon == "lr_scheduler":
            if val not in HPARAM_CHOICES["lr_scheduler"]:
                _fail(f"{where}.lr_scheduler",
                      f"expected one of {', '.join(HPARAM_CHOICES['lr_scheduler'])}, got {val!r}", source)
        else:  # FinetuneConfig's fields: the baselines' rules
            val = _number(val, f"{where}.{key}", source, **HPARAM_BOUNDS[canon])
        resolved[canon] = val
    if needs_data and "data" not in resolved:
        _fail(f"{where}.data", "is required: what to fine-tune on (e.g. full)", source)
    return resolved
