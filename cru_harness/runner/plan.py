"""Cells: one (model x benchmark x split/target x method x seed) unit of work, keyed by a hash of its resolved config.

Besides the method cells, a plan holds reference cells:
- `original`: the model before unlearning, one per (model, benchmark, split/target): the reference row.
- `retain`: TOFU's oracle for Forget Quality, one per (model, split) whose model has a `retain:` spec.
- `finetune`: a model with `finetune:` is first fine-tuned from its `path` with TOFU's recipe; that cell's
  checkpoint is the model every other cell of it starts from (it comes first in the plan; `finetune_cell_for`).
Methods whose result depends on no seed (`Method.seeded`: prompt-only ICU, PURGE's published checkpoints) and
reference cells have `seed` None.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

from ..store import atomic_write_json
from .config import ExperimentConfig, MethodSpec, ModelSpec
from .prompting import decide

HASH_SCHEMA = 1          # bump when the meaning of a resolved cell changes (invalidates caches)
HASH_LENGTH = 16
#: The seed of the cells that make a run's starting models (the fine-tune, a trained retain oracle): one model
#: for every seed, as TOFU publishes one per split. Fixed rather than the config's first seed, because the cells
#: that start from it do not hash it: a run with `--seeds 1,2` reusing another run's cells must start from the
#: same checkpoint they did.
STARTING_MODEL_SEED = 0
_LOCAL_PREFIXES = ("/", "./", "../", "~")


@dataclass(frozen=True)
class Cell:
    kind: str                      # method | original | retain | finetune | attack
    model: ModelSpec
    benchmark: str                 # tofu | rwku
    split: str | None              # TOFU forget split
    target: int | None             # RWKU target index
    method: str                    # canonical method (GA, ..., CRU, ICU, PURGE) or Original / Retain
    label: str                     # table row name
    seed: int | None
    hparams: dict[str, Any]
    corpora: dict[str, str]
    tasks: tuple[str, ...]
    limit: int | None
    evaluation: dict[str, Any]
    data_dir: str | None
    device: str
    extra: dict[str, Any] = field(default_factory=dict)   # retain spec, PURGE local checkpoint
    training: dict[str, Any] = field(default_factory=dict, compare=False)   # the config's engine; not hashed
    # a committed run's former defaults (`as_computed:`): trained with, not hashed (its hashes predate them)
    as_computed: dict[str, Any] = field(default_factory=dict, compare=False)
    # Its decisions (`decisions`, `runner.prompting.CellDecisions`) are not a field: derived from the fields above,
    # neither the hash (`resolved`) nor equality sees them, and `dataclasses.replace` leaves them out (a changed cell
    # is decided again, never read with another cell's decisions). The plan stores them on each cell (`settle`), so
    # execution reads them as data; a cell built otherwise is decided when first asked (`__getattr__`).

    def __getattr__(self, name: str):
        if name != "decisions":   # only called for an attribute the cell does not have
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        decisions = decide(self)
        object.__setattr__(self, "decisions", decisions)   # frozen: set once, as in `with_decisions`
        return decisions

    @property
    def unit(self) -> str:
        """The split or target this cell evaluates on, as shown in tables."""
        from .. import plugins

        return plugins.benchmarks.get(self.benchmark).unit_label(self.split, self.target)

    @property
    def method_plugin(self):
        """The registered method (`cru_harness.api.Method`) whose model this cell serves: its own, or for an
        attack cell the attacked cell's; None for the Original, the oracle and the fine-tune."""
        from .. import plugins

        return plugins.methods.get(self.method) if self.method in plugins.methods.names() else None

    def resolved(self) -> dict[str, Any]:
        """Everything that determines this cell's result; its hash is the cache key."""
        return {
            "hash_schema": HASH_SCHEMA, "kind": self.kind, "model": self.model.identity(),
            "benchmark": self.benchmark, "split": self.split, "target": self.target, "method": self.method,
            "label": self.label, "seed": self.seed, "hparams": self.hparams, "corpora": self.corpora,
            "tasks": list(self.tasks), "limit": self.limit, "evaluation": self.evaluation,
            "data_dir": self.data_dir, "extra": self.extra,
        }

    @property
    def hash(self) -> str:
        return cell_hash(self.resolved())

    @property
    def computation(self) -> str:
        """The hash of what this cell computes (`computation_key`): shared by cells that differ only in label."""
        return computation_key(self.resolved())

    def describe(self) -> str:
        return cell_title(self.model.name, self.benchmark, self.unit, self.label, self.seed)

    def group_key(self) -> tuple:
        """Cells of one (model, benchmark, split/target): a table block."""
        return (self.model.name, self.benchmark, self.unit)


def cell_title(model: str, benchmark: str, unit: str | None, label: str, seed: int | None) -> str:
    """How logs and reproduction tables name a cell: `model | benchmark unit | label seed=N`. A finetune cell has
    no unit (neither split nor target): it trains the model the other cells start from."""
    where = benchmark if unit is None else f"{benchmark} {unit}"
    return f"{model} | {where} | {label}{'' if seed is None else f' seed={seed}'}"


def cell_hash(resolved: dict[str, Any]) -> str:
    canonical = json.dumps(resolved, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]


def computation_key(resolved: dict[str, Any]) -> str:
    """A resolved cell's hash without its label. The label names a table row and enters no computation (the
    executor, trainers and scorers never read it), so cells with one key compute the same numbers: a study's row
    at a run's own CRU setting (`CRU-lambda1` beside the run's `CRU`) is that run's cell under another name. The
    label stays in the cell hash itself, so that every row of a table is a cell of its own."""
    return cell_hash({key: value for key, value in resolved.items() if key != "label"})


def _fill(template: str, benchmark: str, split: str | None, target: int | None) -> str:
    from .. import plugins

    return plugins.benchmarks.get(benchmark).fill(template, split, target)


def build_plan(config: ExperimentConfig, selected_targets: dict[str, list[int]] | None = None) -> list[Cell]:
    """All cells of an experiment, in a stable order: within each block the retain cell (TOFU oracle) first, so
    every other cell of the block finds its per-item truth ratios for Forget Quality, then Original, then methods.

    With `benchmarks.rwku.select_known`, a model's RWKU targets are `selected_targets[model.name]`
    (runner.targets); a model without a selection yet gets no RWKU cells (see `pending_selections`)."""
    from .. import plugins

    cells: list[Cell] = []
    method_cells: dict[tuple, Cell] = {}   # (model, benchmark, split, label, seed) -> cell: what a sequel starts from
    for model in config.models:
        if model.finetune is not None:
            cells.append(_finetune_cell(config, model))
        for bench in model.benchmarks:
            spec = config.benchmarks[bench]
            benchmark = plugins.benchmarks.get(bench)
            selected = (selected_targets or {}).get(model.name, []) if spec.get("select_known") else None
            units = benchmark.units(spec, selected)
            limit = spec["limit"] if spec["limit"] is not None else config.evaluation.get("limit")
            evaluation = {k: v for k, v in config.evaluation.items() if k != "limit"}
            for split, target in units:
                oracle: list[Cell] = []   # the block's retain cell, when it has a model an attack can take
                controls: list[Cell] = []   # the Original: under each attack, what the attack does to the model itself
                tasks = tuple(_fill(task, bench, split, target) for task in spec["tasks"])
                common = dict(model=model, benchmark=bench, tasks=tasks, limit=limit, evaluation=evaluation,
                              data_dir=spec["data_dir"], device=config.device, training=config.training)
                if benchmark.has_oracle and split in model.retain:
                    retain = model.retain[split]
                    trains = retain.kind in ("train", "finetune")
                    data = retain.value["data"] if retain.kind == "finetune" else "{retain_split}"
                    corpora = {"retain_corpus": _fill(data, bench, split, None)} if trains else {}
                    cells.append(Cell(kind="retain", split=split, target=None, method="Retain", label="Retain",
                                      seed=STARTING_MODEL_SEED if trains else None, hparams={},
                                      corpora=corpora, extra={"retain": retain.to_dict()}, **common))
                    if retain.kind != "per_item":
                        oracle.append(cells[-1])
                if config.include_original:
                    cells.append(Cell(kind="original", split=split, target=target, method="Original",
                                      label="Original", seed=None, hparams={}, corpora={}, **common))
                    controls.append(cells[-1])
                block = [cell for method in config.methods if bench in method.benchmarks
                         for cell in _method_cells(config, method, common, split, target)]
                block = _continue_cells(block, benchmark.continues_from(split, target), method_cells)
                cells.extend(block)
                # the attacks: on every method cell, and on the oracle and the Original (the controls: what the
                # attack does to a model that never saw the forget set, and to the model before unlearning)
                forget = {key: _fill(spec[key], bench, split, target) for key in ("forget_corpus", "retain_corpus")}
                cells.extend(_attack_cells(config, oracle + block, forget))
                cells.extend(_attack_cells(config, controls, forget))   # after the others: their order is kept
    return settle(cells)   # each cell's decisions, settled once


def with_decisions(cell: Cell, decisions) -> Cell:
    """A copy of `cell` carrying `decisions` (`runner.prompting.CellDecisions`)."""
    settled = replace(cell)
    object.__setattr__(settled, "decisions", decisions)   # frozen: set once, as the dataclass would in __init__
    return settled


def settle(cells: Iterable[Cell]) -> list[Cell]:
    """`cells`, each carrying its decisions (`runner.prompting.decide`, kept where a cell has them) and the cells of
    the plan it reads, by hash: its oracle (`retain_cell_for`) and the fine-tune it starts from
    (`finetune_cell_for`). The executor reads them; a cell missing from `cells` is None."""
    from .. import plugins

    cells = list(cells)
    finetunes: dict[str, str] = {}
    oracles: dict[tuple, str] = {}
    for cell in cells:   # the first of each, as `finetune_cell_for` and `retain_cell_for` find it
        if cell.kind == "finetune":
            finetunes.setdefault(cell.model.name, cell.hash)
        elif cell.kind == "retain":
            oracles.setdefault((cell.model.name, cell.split), cell.hash)
    settled = []
    for cell in cells:
        has_oracle = cell.kind != "retain" and plugins.benchmarks.get(cell.benchmark).has_oracle
        starts = cell.kind != "finetune" and cell.model.finetune is not None
        settled.append(with_decisions(cell, replace(
            cell.decisions, oracle=oracles.get((cell.model.name, cell.split)) if has_oracle else None,
            starts_from=finetunes.get(cell.model.name) if starts else None, linked=True)))
    return settled


def _continue_cells(block: list[Cell], previous_split: str | None, method_cells: dict[tuple, Cell]) -> list[Cell]:
    """Record each method cell of a block (the cells a later unit may continue), and, where the benchmark says the
    unit continues `previous_split` (`Benchmark.continues_from`), put the hash of the cell it starts from (same
    model, row and seed) in its `extra`: its hash then changes whenever that cell's would. A method whose model is
    not one checkpoint of full weights (routers, WHP's pair) has nothing to continue from: no sequel cell."""
    if previous_split is not None:
        block = [cell for cell in block if cell.method_plugin is None
                 or (cell.method_plugin.one_checkpoint and not cell.method_plugin.adapter)]
    for cell in block:
        if previous_split is not None:
            key = (cell.model.name, cell.benchmark, previous_split, cell.label, cell.seed)
            if key not in method_cells:
                raise ValueError(f"{cell.describe()} continues {previous_split!r}, which has no planned cell")
            cell.extra["continues"] = method_cells[key].hash
        method_cells[(cell.model.name, cell.benchmark, cell.split, cell.label, cell.seed)] = cell
    return block


def continued_cell_for(cell: Cell, cells: Iterable[Cell]) -> Cell | None:
    """The cell a sequel cell starts from (`extra.continues`), None when it is not in `cells`."""
    return next((c for c in cells if c.hash == cell.extra["continues"]), None)


def write_plan(root: Path, config: ExperimentConfig, cells: list[Cell], shard: str | None = None) -> Path:
    """Write a run directory's plan (plan.json, or a shard's plan.shardIofN.json): the config as read and every
    planned cell. The report reads it to name the cells a run left undone."""
    path = Path(root) / ("plan.json" if not shard else f"plan.shard{shard.replace('/', 'of')}.json")
    atomic_write_json(path, {"config": config.raw, "source": config.source, "shard": shard,
                             "cells": [{"hash": c.hash, "cell": c.describe()} for c in cells]})
    return path


def _attack_cells(config: ExperimentConfig, block: list[Cell], corpora: dict[str, str]) -> list[Cell]:
    """One cell per (attacked cell, configured attack): the attacked cell's model under the attack, evaluated with the
    cell's own tasks. Its hash holds the attacked cell's, so it is recomputed whenever that cell would be. `corpora`:
    the block's forget and retain corpora, for an attacked cell that read none (the oracle, ICU, PURGE)."""
    from .. import plugins

    attacked = []
    for attack in config.attacks:
        plugin = plugins.attacks.get(attack.attack)
        for cell in block:
            tasks = tuple(plugin.tasks_for(plugins.benchmarks.get(cell.benchmark), cell.tasks,
                                           attack.settings))   # a prompt attack's task variants
            if not plugin.applies_to(cell.method_plugin) or not tasks:
                continue
            attacked.append(Cell(
                kind="attack", model=cell.model, benchmark=cell.benchmark, split=cell.split, target=cell.target,
                method=cell.method, label=f"{cell.label} + {attack.label}", seed=cell.seed, hparams=cell.hparams,
                as_computed=cell.as_computed,
                corpora={**corpora, **cell.corpora} if cell.kind == "method" else dict(corpora),
                tasks=tasks,
                limit=cell.limit, evaluation=cell.evaluation,
                data_dir=cell.data_dir, device=cell.device,
                extra={"attack": {"name": attack.attack, "settings": attack.settings}, "attacked": cell.hash}))
    return attacked


def attacked_cell_for(cell: Cell, cells: Iterable[Cell]) -> Cell | None:
    """The cell (a method cell, or the oracle) an attack cell attacks."""
    if cell.kind != "attack":
        return None
    return next((other for other in cells if other.hash == cell.extra["attacked"]), None)


def _finetune_cell(config: ExperimentConfig, model: ModelSpec) -> Cell:
    """The cell that fine-tunes `model.path` on `model.finetune["data"]` (TOFU's recipe): no evaluation, but the
    prompt format the TOFU evaluation uses (a legacy or open-unlearning model family, a forced chat choice)."""
    from .. import plugins

    # recorded under the benchmark whose oracle it serves when the model runs one
    bench = next((b for b in model.benchmarks if plugins.benchmarks.get(b).has_oracle), model.benchmarks[0])
    plugin = plugins.benchmarks.get(bench)
    # The evaluation settings that decide how it writes its rows (`runner.prompting.prompt_format`): the chat choice
    # writes any benchmark's rows, the oracle benchmark's own keys its rows under its presets. Only those a config
    # changes from their defaults enter the cell, so a default config's hash stays as it was.
    defaults = {"apply_chat_template": None, **(plugin.evaluation_defaults if plugin.has_oracle else {})}
    prompting = {key: config.evaluation[key] for key, default in defaults.items()
                 if config.evaluation.get(key, default) != default}
    return Cell(kind="finetune", model=model, benchmark=bench, split=None, target=None, method="Finetune",
                label="Finetune", seed=STARTING_MODEL_SEED, hparams=dict(model.finetune),
                corpora={"train_corpus": model.finetune["data"]}, tasks=(), limit=None, evaluation=prompting,
                data_dir=config.benchmarks[bench]["data_dir"], device=config.device)


def finetune_cell_for(cell: Cell, cells: Iterable[Cell]) -> Cell | None:
    """The cell whose checkpoint `cell`'s model starts from (None: the model is used as given)."""
    if cell.kind == "finetune" or cell.model.finetune is None:
        return None
    for other in cells:
        if other.kind == "finetune" and other.model.name == cell.model.name:
            return other
    return None


def pending_selections(config: ExperimentConfig, selected_targets: dict[str, list[int]] | None) -> list[str]:
    """Models whose RWKU targets are still to be chosen by `select_known` (their RWKU cells are not planned)."""
    selecting = [bench for bench, block in config.benchmarks.items() if block.get("select_known")]
    return [m.name for m in config.models
            if any(b in m.benchmarks for b in selecting) and m.name not in (selected_targets or {})]


def _method_cells(config: ExperimentConfig, method: MethodSpec, common: dict, split, target) -> Iterable[Cell]:
    from .. import plugins

    plugin = plugins.methods.get(method.method)
    bench = common["benchmark"]
    # a benchmark's own setting of the method enters the cell's hparams, so its hash says which setting it trained
    # with (CRU's RWKU setting; a benchmark package's reference settings, `Benchmark.method_settings`)
    # (`benchmark_defaults["*"]`: on every benchmark); a former default restated under `as_computed` replaces them
    defaults = {**plugin.benchmark_defaults.get("*", {}),
                **plugins.benchmarks.get(bench).method_settings(plugin.name, split),
                **plugin.benchmark_defaults.get(bench, {})}
    hparams = {**{k: v for k, v in defaults.items() if k not in method.as_computed},
               **method.hparams_for(bench, split)}
    corpora = {}
    if plugin.reads_corpora:
        for key in ("forget_corpus", "retain_corpus"):
            template = method.corpora.get(key, config.benchmarks[bench][key])
            corpora[key] = _fill(template, bench, split, target)
    # a method with entry settings gets them (a plugin written without `settings=` keeps working)
    entry = {"settings": method.settings} if method.settings else {}
    extra = plugin.cell_extra(config, bench, split, target, **entry)
    if method.tuning:   # the choice `tuning:` made (`runner.tuning`): its rule, grid and validation cells
        extra = {**extra, "tuning": method.tuning}
    common = dict(common, tasks=tuple(plugin.tasks_for(plugins.benchmarks.get(bench), common["tasks"])))   # ICU's
    seeds = list(config.seeds) if plugin.seeded else [None]
    for seed in seeds:
        yield Cell(kind="method", split=split, target=target, method=method.method, label=method.label,
                   seed=seed, hparams=hparams, corpora=corpora, extra=extra, as_computed=method.as_computed,
                   **common)


def retain_cell_for(cell: Cell, cells: Iterable[Cell]) -> Cell | None:
    """The retain (oracle) cell whose per-item truth ratios give this TOFU cell's Forget Quality."""
    from .. import plugins

    if not plugins.benchmarks.get(cell.benchmark).has_oracle:
        return None
    for other in cells:
        if other.kind == "retain" and other.model.name == cell.model.name and other.split == cell.split:
            return other
    return None


def is_hub_id(path: str) -> bool:
    """A model path that will be fetched from the Hub (not local, not a built-in testbed model)."""
    from ..testbed.names import is_builtin_model

    if path.startswith(_LOCAL_PREFIXES) or is_builtin_model(path):
        return False
    from pathlib import Path

    if Path(path).expanduser().exists():
        return False
    return path.count("/") == 1


def _finetune_cost(spec: dict, corpus: str, cell: Cell) -> str:
    """The optimizer steps of a fine-tuning cell (TOFU's recipe overridden by `spec`), for `--dry-run`."""
    from ..baselines.plugin import training_cost
    from ..finetune import FinetuneConfig

    config = FinetuneConfig.from_dict({k: v for k, v in spec.items() if k not in ("data", "dtype")})
    return training_cost(config, corpus, cell.benchmark, cell.data_dir)


def describe_cell(cell: Cell) -> dict[str, Any]:
    """What running this cell does: trains, downloads, evaluates (for `--dry-run`). Touches no model."""
    downloads, trains = [], None
    if is_hub_id(cell.model.path):
        downloads.append(f"model {cell.model.path} (Hub)")
    if cell.kind == "finetune":
        trains = (f"fine-tune {cell.model.path} on {cell.corpora['train_corpus']} (TOFU's recipe); "
                  f"{_finetune_cost(cell.hparams, cell.corpora['train_corpus'], cell)}")
    elif cell.kind == "retain":
        retain = cell.extra["retain"]
        if retain["kind"] == "finetune":
            trains = (f"retain model: fine-tune {cell.model.path} on {cell.corpora['retain_corpus']} (TOFU's recipe); "
                      f"{_finetune_cost(retain['value'], cell.corpora['retain_corpus'], cell)}")
        elif retain["kind"] == "train":
            source = retain["value"].get("from", cell.model.path)
            trains = f"retain model: fine-tune {source} on {cell.corpora['retain_corpus']}"
            if is_hub_id(source):
                downloads.append(f"model {source} (Hub)")
        elif retain["kind"] == "checkpoint":
            if is_hub_id(retain["value"]):
                downloads.append(f"retain model {retain['value']} (Hub)")
        else:
            trains = None
    elif cell.kind == "method":
        trains, fetched = cell.method_plugin.describe(cell)
        if fetched:
            downloads = fetched
    elif cell.kind == "attack":
        settings = ", ".join(f"{k}={v}" for k, v in sorted(cell.extra["attack"]["settings"].items()))
        trains = f"attack {cell.extra['attack']['name']} on cell {cell.extra['attacked']}" + \
            (f" [{settings}]" if settings else "")
    evaluates = None if (cell.kind == "finetune" or (cell.kind == "retain" and
                                                     cell.extra["retain"]["kind"] == "per_item")) else list(cell.tasks)
    return {"hash": cell.hash, "cell": cell.describe(), "kind": cell.kind, "trains": trains,
            "downloads": downloads, "evaluates": evaluates, "limit": cell.limit}
