"""The plugin API: what a benchmark, a method and an attack are to the runner.

A plugin is an instance of one of the classes below (usually of a subclass that overrides a few methods),
registered under an entry-point group (`cru_harness.plugins`). The runner, scoring, reporting and studies read
these objects through their hooks (a benchmark's data source, corpus names, evaluation and lm-eval metadata keys,
task folder, prompt-attack variants, oracle, report blocks) and never compare a plugin's name
(`tests/test_benchmark_names.py` greps for that). docs/extending.md has a worked example of each.

Foundation layer: no torch, nothing of the project above `errors` is imported here; what a plugin needs at run
time reaches it through `CellContext`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Mapping


#: Where an adapter method's cell (`Method.adapter`: CRU) keeps its router bundle, inside its work directory: the
#: runner copies it with the cell (`--reuse`), the studies read it.
ROUTERS_DIR = "routers"


class CellUnavailable(RuntimeError):
    """The cell cannot be computed for an external reason (e.g. a PURGE checkpoint not published / Hub down):
    recorded as `unavailable` with its reason, not as a failure."""

    def __init__(self, reason: str, details: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.details = details or {}


@dataclass
class Trained:
    """What a method's `run` hands to the evaluation: the model to load, and router bundles to attach (CRU)."""
    model_path: str
    routers: str | None = None


class SettingError(ValueError):
    """A setting of a method's config entry that cannot be used (`Method.read_settings`): `key` under the entry
    (`checkpoints.21`) and what is wrong."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


class ModelLoader:
    """How the evaluation loads a saved model that is not one checkpoint (`Method.model_loader`): lm-eval's `cru`
    model loads `checkpoint` as it loads any base (its config and tokenizer are the evaluation's), then `build`
    makes the model it serves. `name`: the kind of model, in messages (`WHP`)."""

    name: str = ""
    checkpoint: str = ""

    def build(self, model: Any, load: Callable[[str], Any]) -> Any:
        """The served model from the loaded `checkpoint`; `load(path)` loads another checkpoint the same way
        (dtype, device map)."""
        return model

    def identity(self) -> dict[str, Any]:
        """What decides its logits beyond `checkpoint` (part of the `--use_cache` identity)."""
        return {}

    def info(self) -> dict[str, Any]:
        """What lm-eval's results record of it (`get_model_info`)."""
        return {}


@dataclass
class CellContext:
    """Everything a method or an attack may use while a cell runs (built by the runner).

    `cell`: the runner's cell (public attributes: `kind`, `benchmark`, `split`, `target`, `method`, `seed`,
    `hparams`, `corpora`, `extra`, `evaluation`, `device`, `model` with `path`, `device_map`, `trust_remote_code`).
    `model_path`: the model the cell starts from. `outcome`: the cell's record under construction: put
    `resources`, `details` and `artifacts` there. `prompt_format`: how question-answer rows are written for
    training (`cru_harness.prompts.qa_texts` keywords), as the cell's evaluation asks them. `load_model(path)`:
    (model, tokenizer) on the cell's device and dtype. `dtype`: the training dtype name; `device`: the
    resolved device."""
    cell: Any
    model_path: str
    workdir: Path
    data_dir: str | None
    outcome: dict
    chat: bool
    prompt_format: dict
    dtype: str
    load_model: Callable[[str], tuple[Any, Any]]
    device: str = "cpu"            # the resolved device the cell runs on
    routers: str | None = None     # for an attack: the bundles the attacked cell attached
    base_path: str | None = None   # for an attack: the model the attacked cell started from (its Original)


class Method:
    """An unlearning method as the runner sees it. Override what differs from a full-weight trainer.

    `name`: the canonical name configs use (matched case-insensitively). `config`: the hyperparameter dataclass,
    which validates itself in `__post_init__` (as PEFT's `LoraConfig`); its fields, minus `runner_fields`, are the
    keys a config entry may set. `aliases`: other spellings accepted in configs (`lr` -> `learning_rate`).
    `known_as`: other names of the method itself, accepted wherever a method is named (open-unlearning's trainer
    names: `GradAscent` for GA); configs, results and cell hashes hold `name`.
    `benchmarks`: the benchmarks it runs on (None: every registered one). `benchmark_defaults`: settings per
    benchmark that differ from the dataclass's defaults and enter each cell's hyperparameters (so its hash says
    which setting trained it; key "*": on every benchmark, under a benchmark's own); `former_defaults`: values
    its defaults had before a change, which a committed config may restate under `as_computed:` (they train its
    cells, outside their hashes); `sources`: where each default comes from. `seeded`: False for a method whose result
    does not depend on a seed (prompt-only, published checkpoints). `reads_corpora`: whether it trains on the forget
    / retain corpora. `needs`: what it needs beyond the forget corpus, for `cru-harness methods`. `adapter`: it
    leaves the base untouched and attaches bundles (its cells have router artifacts). `one_checkpoint`: its
    deployed model is one checkpoint (False for WHP, two models whose logits are combined): an attack or metric
    that loads, quantizes or trains one checkpoint does not apply to it."""

    name: str = ""
    summary: str = ""
    config: type | None = None
    runner_fields: tuple[str, ...] = ()
    aliases: Mapping[str, str] = {}
    known_as: tuple[str, ...] = ()
    benchmarks: tuple[str, ...] | None = None
    benchmark_defaults: Mapping[str, Mapping[str, Any]] = {}
    #: defaults it had before a change, which a committed config restates under `as_computed:` so that its cells
    #: keep their hashes and train as they did (hyperparameter -> the former value)
    former_defaults: Mapping[str, Any] = {}
    sources: Mapping[str, str] = {}
    seeded: bool = True
    reads_corpora: bool = True
    trains: bool = True
    needs: tuple[str, ...] = ()
    adapter: bool = False
    one_checkpoint: bool = True
    #: keys of its config entry that are settings, not hyperparameters (key -> what it holds), checked by
    #: `read_settings`; they reach its cells through `cell_extra` (PURGE's `checkpoints`: local stand-ins)
    entry_settings: Mapping[str, str] = {}
    #: top-level keys of earlier configs that are now one of its `entry_settings` (old -> new): still read into
    #: its entries, with a one-line note naming the new key
    moved_keys: Mapping[str, str] = {}
    #: It trains on question / answer rows (an answer to prefer, refuse or redirect: IdkDPO, DPO, RT, LUNAR), so a
    #: benchmark whose corpora are passages (`Benchmark.passage_corpora`) is refused at config validation.
    needs_qa_rows: bool = False
    #: Its default grid for `tuning:` (`runner.tuning`): {"grid": {hparam: [values]}, "source": where the values come
    #: from}; None: the method has no default grid (a config's `tuning.grids` may still give one).
    tuning_grid: Mapping[str, Any] | None = None
    order: int = 100               # where listings put it (lower first; then by name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def hparams(self) -> tuple[str, ...]:
        """The keys a config entry of this method may set (canonical names)."""
        if self.config is None:
            return ()
        return tuple(f.name for f in dataclasses.fields(self.config) if f.name not in self.runner_fields)

    def refuse_hparam(self, key: str) -> str | None:
        """A method-specific reason why `key` is not a hyperparameter of it (None: the generic message)."""
        return None

    def check_hparams(self, values: dict[str, Any]) -> None:
        """Raise the config dataclass's own error for values it refuses (a config is refused before any work)."""
        if self.config is not None:
            self.config(**values)

    def unsupported(self, benchmark: str) -> str | None:
        """Why this method cannot run on `benchmark`, or None when it can."""
        if self.benchmarks is not None and benchmark not in self.benchmarks:
            return f"{self.name} does not support {benchmark}"
        return None

    def tasks(self, tasks: tuple[str, ...]) -> tuple[str, ...]:
        """The evaluation tasks of its cells (a prompt-only method swaps in its task variants)."""
        return tasks

    def tasks_for(self, benchmark: "Benchmark", tasks: tuple[str, ...]) -> tuple[str, ...]:
        """`tasks` for its cells of `benchmark` (what the plan calls): by default `tasks(tasks)`; a prompt-only
        method asks the benchmark for its variants (`Benchmark.task_variants`, ICU's)."""
        return self.tasks(tasks)

    def check_config(self, config: Any, where: str) -> tuple[str, str] | None:
        """A problem with the rest of an experiment config for this method (key, message), or None. `config`: the
        validated parts (`benchmarks`, `models`) and the entry's `settings`."""
        return None

    def read_settings(self, values: dict[str, Any]) -> dict[str, Any]:
        """Its `entry_settings` as a config entry gives them, checked and normalised; a bad one raises
        `SettingError` naming the key."""
        return dict(values)

    def entry_paths(self, settings: Mapping[str, Any]) -> list[tuple[str, str, str]]:
        """(key under its entry, what it is, path) of every local model its `entry_settings` name (the run's
        security summary lists what it loads)."""
        return []

    def cell_extra(self, config: Any, benchmark: str, split: str | None, target: int | None,
                   **entry: Any) -> dict[str, Any]:
        """Settings of one cell beyond its hyperparameters that enter its hash (e.g. a local checkpoint). A method
        with `entry_settings` gets its entry's as `settings=` (`read_settings`'s output)."""
        return {}

    def trained_weights(self, cell: Any) -> str:
        """What a cell of this method trains, in words (`--dry-run`)."""
        return "routers (base frozen)" if self.adapter else "all weights"

    def describe(self, cell: Any) -> tuple[str | None, list[str]]:
        """What running a cell does, for `--dry-run`: (what it trains, what it downloads)."""
        hp = ", ".join(f"{k}={v}" for k, v in sorted(cell.hparams.items())) or "defaults"
        what = self.trained_weights(cell)
        return (f"{cell.method} {what} on forget={cell.corpora.get('forget_corpus')} "
                f"retain={cell.corpora.get('retain_corpus')} [{hp}]"), []

    def model_loader(self, path: str) -> ModelLoader | None:
        """How the evaluation loads the model this method saved at `path` when it is not one checkpoint (WHP: two
        models whose logits combine); None (the default): `path` is not such a model of this method."""
        return None

    def run(self, ctx: CellContext) -> Trained:
        """Train (or fetch) the model a cell evaluates."""
        raise NotImplementedError(f"{type(self).__name__}.run")


class Attack:
    """An attack on a finished cell's deployed model (for CRU: base + bundles attached). `run(ctx)` returns the
    attacked model (`Trained`); the runner evaluates it with the tasks of the cell it attacks, as a cell of kind
    `attack`, keyed and resumed like every cell. `config`: its settings dataclass (validates itself)."""

    name: str = ""
    summary: str = ""
    config: type | None = None
    seeded: bool = False
    needs_one_checkpoint: bool = False   # it loads, quantizes or trains the attacked model as one checkpoint
    order: int = 100

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def settings(self) -> tuple[str, ...]:
        return () if self.config is None else tuple(f.name for f in dataclasses.fields(self.config))

    def applies_to(self, method: "Method | None") -> bool:
        """Whether the plan attacks a cell of `method` (None: the retain oracle or the Original, the controls). An
        attack that loads, quantizes or trains one checkpoint (`needs_one_checkpoint`) skips a model of several
        (WHP's); one that would only re-evaluate the model as deployed (detach on a method without a bundle)
        overrides this: no cell, no compute for a number known beforehand."""
        return not self.needs_one_checkpoint or method is None or method.one_checkpoint

    def check_settings(self, values: dict[str, Any]) -> None:
        if self.config is not None:
            self.config(**values)

    def tasks(self, tasks: tuple[str, ...], settings: Mapping[str, Any]) -> tuple[str, ...]:
        """The tasks its cells evaluate: the attacked cell's, or variants of them (an attack on the prompts). Empty
        (an attack on the prompts of tasks that have no variant): the plan makes no cell, whose numbers would be
        the attacked cell's."""
        return tasks

    def task_metadata(self, settings: Mapping[str, Any], seed: int | None) -> dict[str, Any]:
        """Settings its task variants read, under generic names; the attacked benchmark maps them to its tasks'
        metadata keys (`Benchmark.variant_metadata`). {} for none."""
        return {}

    def tasks_for(self, benchmark: "Benchmark", tasks: tuple[str, ...], settings: Mapping[str, Any]
                  ) -> tuple[str, ...]:
        """`tasks` for a cell of `benchmark` (what the plan calls): by default `tasks(tasks, settings)`; an attack on
        the prompts asks the benchmark for its variants (`Benchmark.task_variants`)."""
        return self.tasks(tasks, settings)

    def check_inputs(self, cell: Any, local: bool) -> tuple[str, str] | None:
        """What one of its cells reads, checked before any cell runs (`run` and `run --dry-run`): (the setting,
        the problem) for the first that would fail the cell, else None: a corpus that is not there, does not parse
        or is another benchmark's, a slice larger than the forget set. `local`: the cell's benchmark data is on
        this machine; when False nothing of the benchmark's may be read (it would be downloaded)."""
        return None

    def run(self, ctx: CellContext) -> Trained:
        raise NotImplementedError(f"{type(self).__name__}.run")


@dataclass(frozen=True)
class DataSource:
    """Where a benchmark's data comes from (`cru_harness.data.sources.resolve_local_dir` reads it).

    `folder`: its folder's name under a data root (`CRU_HARNESS_DATA_DIR`, or a `data_dir` holding several
    benchmarks' folders); `marker`: a file or folder every local copy holds at its top, which tells the benchmark's
    folder from a root; `hub_id`: the Hugging Face dataset it is read from when no local copy is given (None: local
    only); `env_var`: the environment variable naming its folder (None: only `data_dir` / the root)."""
    folder: str
    marker: str
    hub_id: str | None = None
    env_var: str | None = None


class Benchmark:
    """A benchmark: its unit of evaluation, its tasks and training corpora, its oracle and its scorer.

    `unit`: what one cell evaluates on, `split` (a named unit: TOFU's forget split) or `target` (a numbered unit:
    RWKU's target), the cell field that holds it. `config_keys`: the keys its `benchmarks.<name>` block accepts
    (`tasks`, `limit`, `forget_corpus`, `retain_corpus`, `data_dir` are read by the runner; the rest by
    `resolve_block`). `default_tasks` / `default_corpora`: lm-eval tasks and corpus sources, with `{placeholders}`
    filled per cell (`placeholder_values`). `has_oracle`: its cells are scored against a retain model (TOFU's
    Forget Quality; `oracle_from_file`, `compare_to_oracle`). docs/extending.md lists every hook."""

    name: str = ""
    summary: str = ""
    unit: str = "split"
    config_keys: tuple[str, ...] = ("tasks", "limit", "forget_corpus", "retain_corpus", "data_dir")
    default_tasks: tuple[str, ...] = ()
    default_corpora: Mapping[str, str] = {}
    placeholders: tuple[str, ...] = ()
    has_oracle: bool = False
    order: int = 100
    hub_files: tuple[tuple[str, str], ...] = ()   # (dataset repo, a file every copy holds): its data's provenance
    #: Where its data comes from (`DataSource`; a subclass reading its parent's folder inherits it). None: it reads
    #: no data folder of its own (its corpora are files, its tasks read their own data).
    data: DataSource | None = None
    #: Its question format is the one `prompts.qa_texts` writes when no benchmark is named (the training code's and
    #: the single-model commands' default): True for one built-in (TOFU's), False for any other.
    default_questions: bool = False
    #: Model configs with fixed question tags of its own that `--prompt-format` may name (TOFU: open-unlearning's
    #: configs without a chat template; `prompt_format_choice` reads them), and the setting that evaluates with them.
    prompt_families: tuple[str, ...] = ()
    prompt_family_setting: str = ""
    #: How its corpus names look (`corpus_rows`), for the error naming every source a corpus may be.
    corpus_help: str = ""
    #: Its lm-eval task folder (YAMLs + their code), indexed beside the project's own by the runner and by lm-eval's
    #: `TaskManager` (`cru_harness.lmeval.registration.task_paths`). None: its tasks are lm-eval's own.
    task_folder: str | None = None
    #: The `evaluation:` keys it reads, with their defaults (validation fills them in; the runner passes those in
    #: `metadata_keys` to its tasks as lm-eval metadata). `check_evaluation` checks their values.
    evaluation_defaults: Mapping[str, Any] = {}
    #: Its `evaluation_defaults` are filled into every config's `evaluation` (so every cell's hash), not only the
    #: configs that run it: True for the built-ins, whose recorded cell hashes hold them. A new benchmark leaves it
    #: False, so that installing it moves no other benchmark's cell.
    evaluation_in_every_cell: bool = False
    #: The lm-eval metadata keys its tasks read (`--metadata '{...}'`); `metadata_prefixes`: a key starting with
    #: one of these that is not in `metadata_keys` is a misspelling (`cru_harness.lmeval.metadata`); `task_keys`:
    #: keys its task YAMLs set, which the metadata may not (key -> why).
    metadata_keys: tuple[str, ...] = ()
    metadata_prefixes: tuple[str, ...] = ()
    task_keys: Mapping[str, str] = {}
    #: The `retain:` kinds its oracle accepts (`runner.config`); `per_item` also needs `oracle_from_file`.
    oracle_kinds: tuple[str, ...] = ("checkpoint", "train", "finetune")
    # How reports show it (read by `cru_harness.reporting`): `columns` are `reporting.tables.Column`s, in order;
    # `table_unit` heads the unit column; `caption` is the LaTeX table's; `axis_labels` the trade-off plot's;
    # `kept_score_name` names what the one-learning-rate rule keeps (None: the rule skips this benchmark).
    columns: tuple = ()
    table_unit: str = "Split"
    caption: str = ""
    table_note: str | None = None  # printed under its Markdown table (e.g. a score's definition and source)
    axis_labels: tuple[str, str] = ("Forgetting", "Utility")
    kept_score_name: str | None = None
    kept_score_short: str = ""     # its column header in the sweep table
    study_keys: tuple[tuple[str, str], ...] = ()   # (metric, header) a study table shows, forget and utility first
    recovery_metric: str | None = None   # the forget metric (higher = more knowledge) attacks' recovery is read on
    stats_note: str | None = None  # a caveat printed with the method comparison's p-values
    #: the `evaluation:` key naming the scoring preset (whose reference the numbers reproduce); reports name it
    preset_key: str | None = None
    #: Its training corpora are passages, with no question or answer (WMDP): a method that needs question / answer
    #: rows (`Method.needs_qa_rows`) does not run on it.
    passage_corpora: bool = False
    #: Where a model that knows nothing sits on the trade-off plot's forgetting axis (`forgetting_utility`), drawn
    #: there as a dashed line (WMDP: 1 - its chance accuracy 0.25). None: no such line.
    chance_forgetting: float | None = None

    def metric_range(self, name: str) -> tuple[float, float] | None:
        """The range of one of its cells' metrics (`metrics` of result.json) that the core's table
        (`store.metric_range`) does not know; a value outside it refuses the cell. None: any finite number."""
        return None

    def plots(self, rows: list[dict], out_dir: Path) -> list[Path]:
        """Figures of its own beside the trade-off plot (from the leaderboard rows), written under `out_dir`."""
        return []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def row_unit(self, result: dict) -> str | None:
        """The unit a leaderboard row aggregates a result into (a split; `all targets` for a mean over units)."""
        return result.get("split")

    def derive(self, metrics: dict, result: dict) -> None:
        """Add a result's derived columns to `metrics` in place (e.g. 1 - ROUGE-L)."""

    def derive_mean(self, metrics: dict, spread: dict) -> None:
        """Recompute, in place, a leaderboard row's columns that pick among a cell's values (a mean of each seed's
        pick would mix different picks); `spread`: the row's per-metric sd over seeds."""

    def forgetting_utility(self, metrics: dict) -> tuple[float | None, float | None]:
        """The trade-off axes of one result: (forgetting, utility), each higher-is-better, or None."""
        return None, None

    def kept_score(self, result: dict) -> float | None:
        """What the learning-rate rule must keep (`reporting.lr_sweep`), or None."""
        return None

    def unit_items(self, split: str | None, target: int | None) -> frozenset | None:
        """The items one unit evaluates as forget items, as hashable keys that mean the same across benchmarks
        sharing data (TOFU and TOFU author: `("TOFU full", row)`); None: not declared. `tuning:` refuses a
        validation unit sharing one with a reported unit (`runner.tuning`)."""
        return None

    def corpus_items(self, source: str) -> frozenset | None:
        """The items of a corpus source, keyed as `unit_items` (None: not declared): what a fine-tune taught."""
        return None

    def resolve_block(self, block: dict, where: str, fail: Callable[[str, str], None]) -> dict[str, Any]:
        """The unit settings of its config block, checked (`fail(key, message)` raises): e.g. `{"splits": [...]}`."""
        return {}

    def units(self, block: dict, selected: list | None = None) -> list[tuple[str | None, int | None]]:
        """The (split, target) of each unit a resolved block evaluates (`selected`: a run-time choice of units)."""
        return []

    def placeholder_values(self, split: str | None, target: int | None) -> dict[str, Any]:
        return {"split": split or "", "target": target if target is not None else ""}

    def fill(self, template: str, split: str | None, target: int | None) -> str:
        """A task or corpus template (`tofu_{split}`, `rwku_{target}`) with this unit's placeholders filled."""
        return template.format(**self.placeholder_values(split, target))

    def task_metadata(self, split: str | None, target: int | None) -> dict[str, Any]:
        """lm-eval metadata its tasks read for one unit, beside the presets and `data_dir` (e.g. TOFU's author)."""
        return {}

    def model_metadata(self, cell: Any) -> dict[str, Any]:
        """lm-eval metadata its tasks read about the cell's model (e.g. the tokenizer a reference is cut with: the
        starting model's, `cell.model.path`); {} for none."""
        return {}

    def continues_from(self, split: str | None, target: int | None) -> str | None:
        """The unit (split) whose method cell of the same model, row and seed a method cell of this unit starts from
        (a sequential request, MUSE's sustainability: each applied to the previous result); None: the model's own
        start. The runner plans that cell first, puts its hash in this one's (`extra.continues`) and trains on its
        model."""
        return None

    def method_settings(self, method: str, split: str | None) -> dict[str, Any]:
        """Its reference's settings of a method (by the method's name) for a unit: they enter the method's cells'
        hyperparameters below the method's own `benchmark_defaults` and the config's values, so a cell's hash says
        which setting trained it. {} for none."""
        return {}

    def method_defaults(self, method: str, split: str | None, given: Collection[str] = ()) -> dict[str, Any]:
        """Its protocol's training settings of a method (by the method's name) for a unit: the method's trainer
        starts from them, below the cell's hyperparameters, and unlike `method_settings` they are not in the cell's
        hash (RWKU's LLaMA-Factory schedule). `given`: the keys the cell sets itself (a unit with no setting of its
        own may accept them instead). {} for none; `errors.InputError` for a unit the method has no setting for."""
        return {}

    def score_tasks(self, forget: str | None) -> tuple[str, ...]:
        """The lm-eval tasks that score one model outside a run, after it was attacked or unlearned on the corpus
        `forget` (a corpus name, or None): `cru-harness attack` prints that lm_eval command. () for none (the
        command then points to a runner config)."""
        return ()

    def prompt_metadata(self, prompt_format: str) -> dict[str, Any]:
        """lm-eval metadata its tasks need to ask a model as `prompt_format` (a `--prompt-format` label: `chat`,
        `plain` or a model family) outside a run; {} for none."""
        return {}

    def refusals(self, data_dir) -> list[str] | None:
        """Refusal answers it publishes, which a method trained toward refusing (IdkDPO, DPO, RT) draws from when a
        forget row brings no `alternate` answer of its own (TOFU: IdkDPO's `idontknow` list). None: it has none
        (`baselines.unlearn` takes the first registered benchmark's that has)."""
        return None

    def lora_preset(self) -> dict[str, Any] | None:
        """The LoRA settings its reference runs use (`training.lora.LoraSettings` fields), offered as
        `--lora <name>`; None when it publishes none."""
        return None

    def unit_label(self, split: str | None, target: int | None) -> str:
        return split if self.unit == "split" else f"target{target}"

    def check_data_dir(self, value: str) -> str | None:
        """A problem with a `data_dir` for this benchmark, or None."""
        return None

    def corpus_rows(self, source: str, data_dir) -> tuple[list[dict], str] | None:
        """The rows of a corpus named `source` (`data.corpora.load_corpus_rows` asks every benchmark, in registry
        order, after files): (rows with `question`+`answer` or `text`, where they came from), or None when the name
        is not one of its corpora. A row may carry `qa_texts` keywords of its benchmark (`prompt_keys`)."""
        return None

    #: How the baselines' trainer pairs each forget example with a retain example: "drawn" (drawn again every
    #: epoch from the seed, as TOFU's and open-unlearning's datasets do) or "cycled" (forget example i with retain
    #: example i mod n, every epoch: MUSE's `ForgetRetainDataset`).
    retain_pairing: str = "drawn"

    def training_examples(self, tokenizer, rows: list[dict], side: str, max_length: int) -> list | None:
        """The examples the baselines' trainer trains on for a corpus of its cells, when they are not one per row
        (MUSE: its split's texts joined and cut into blocks of `max_length` tokens). `side`: "forget" or
        "retain", or "training" for a fine-tune on its corpus (a model's `finetune:`, the relearning attack). Each example is a list of token ids, every one a label, or a dict with `input_ids` and `labels`
        (-100 where not trained on), at most `max_length` long. None (the default): one example per row, as
        `baselines.data.encode_row` writes it."""
        return None

    def chat_turns(self, question: str, **keys: Any) -> tuple[list[dict], dict] | None:
        """The chat turns its evaluation renders for `question` with no system turn, and `prompts.render_chat`'s
        options for them (RWKU: the probe's user message, its answer prefix as an opening assistant turn, RWKU's
        date); `keys`: the row's `prompt_keys`. What LUNAR builds its prompts from (its code writes no system turn).
        None (the default): one user turn holding the question, then the generation prompt."""
        return None

    def qa_texts(self, tokenizer, question: str, answer: str, **fmt: Any) -> Any:
        """How its evaluation asks one question-answer pair (`cru_harness.prompts.QATexts`), so a method trains on
        what is scored; `fmt`: `chat` and the keywords of `training_prompt_format` and of the row that are set
        (`preset`, `family`, `probe`, `aa_type`, ...; `prompts.qa_texts` dispatches here for every benchmark). None:
        the generic writer (the chat template, else `Question: {q}\nAnswer:` and the answer after a space)."""
        return None

    def prompt_format_choice(self, choice: str) -> dict[str, Any] | None:
        """The `qa_texts` keywords of a `--prompt-format` value (`auto`, `chat`, `plain` or one of `prompt_families`)
        for its rows; raise `prompts.PresetError` for one it cannot take. None: the generic `{"chat": ...,
        "family": None}`."""
        return None

    def prompt_keys(self, row: dict) -> dict[str, Any]:
        """The `qa_texts` keywords a corpus row carries (e.g. the probe that asks it); {} for none."""
        return {}

    def finetune_prompt_format(self, cell: Any, chat: bool, presets: dict) -> dict[str, Any]:
        """How a fine-tune it serves (a model's `finetune:`, its oracle's `retain: {finetune: ...}`) writes its rows:
        `cru_harness.finetune.finetune` keywords (`chat`, and `preset` / `family` where it has them)."""
        return {"chat": bool(chat)}

    def task_variants(self, tasks: tuple[str, ...], variant: str) -> tuple[str, ...]:
        """The tasks an attack on the prompts evaluates (`attacks.prompt_variants`): each of `tasks` that has a
        `variant` (`paraphrase`, `in_context`) replaced by it, the variants alone; () when none has one (the plan
        then makes no cell: its numbers would be the attacked cell's)."""
        return ()

    def variant_metadata(self, variant: str, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The lm-eval metadata its `variant` tasks read, from the attack's generic settings
        (`Attack.task_metadata`: e.g. in_context's `k`, `slice_fraction`, `seed`); {} for none."""
        return {}

    def forget_items(self, cell: Any, data_dir) -> tuple[list[dict], str] | None:
        """Every question-answer row of the cell's forget task, in the task's order, and their source (an attack on
        the prompts draws its slice from them). None: no such rows."""
        return None

    def lmeval_tasks(self, tasks: list[str], data_dir) -> Any:
        """A context manager yielding `(include paths, task specs)` for lm-eval: task folders to index beside the
        project's (`task_folder`), and what to hand `simple_evaluate` for `tasks`. A benchmark whose tasks are
        lm-eval's own names their folders here, and may point them at a local copy of their data (WMDP: a wrapper
        group overriding `dataset_path`). Default: nothing more to index, the names as they are."""
        from contextlib import nullcontext

        return nullcontext(([], list(tasks)))

    def per_unit_results(self, samples: Mapping[str, list]) -> dict[str, dict]:
        """Per-unit numbers of tasks that evaluate several of its units in one pass (RWKU's targets, for
        `select_known`), from lm-eval's logged samples `{task: rows}`: `{task: {unit: {"target_name", "n", metric:
        value}}}`. {} when its tasks evaluate one unit each."""
        return {}

    def lmeval_limit(self, limit: int | None) -> tuple[int | None, dict[str, Any]]:
        """A cell's `limit` as (lm-eval's `limit`, metadata its tasks read instead), e.g. rows per file and unit."""
        return limit, {}

    def oracle_from_file(self, path: str, cell: Any) -> dict:
        """The oracle result of `retain: {per_item: FILE}` (what `compare_to_oracle` and `score` read)."""
        raise NotImplementedError(f"{type(self).__name__}.oracle_from_file")

    def oracle_as_reference(self, tasks: tuple[str, ...]) -> bool:
        """Whether one of `tasks` reads the oracle's checkpoint as a reference model (lm-eval's `reference`: TOFU's
        privacy tasks' reference attack); the runner then passes it when the oracle's checkpoint is on the machine."""
        return False

    def compare_to_oracle(self, result: dict, oracle: dict | None) -> None:
        """Fill, in place, a finished cell's numbers measured against its oracle (`oracle`: the oracle cell of the
        same model and unit, or None), as the report shows them; called for the oracle's own cell too."""

    def report_lines(self, results: list[dict], after: str) -> list[str]:
        """Markdown blocks of its own in report.md, from its cells (every status): `after="table"` right after its
        leaderboard (TOFU: the regime check), `after="robustness"` after the robustness table (RWKU: AA types)."""
        return []

    def check_evaluation(self, evaluation: dict) -> None:
        """Raise `cru_harness.prompts.PresetError` for an `evaluation:` setting this benchmark cannot use (a config
        that runs it)."""

    def check_presets(self, evaluation: dict) -> None:
        """Raise `cru_harness.prompts.PresetError` for a value of its own `evaluation_defaults` keys that names
        nothing (an unknown preset), whether or not the config runs it."""

    def tasks_under(self, tasks: list[str], evaluation: dict, defaulted: bool) -> list[str]:
        """The tasks a cell evaluates under `evaluation`'s presets. A task the presets cannot score raises
        `cru_harness.prompts.PresetError` when the config names it; a default one (`defaulted`) is left out."""
        return tasks

    def fixed_prompt_format(self, evaluation: dict) -> bool:
        """Whether the evaluation settings fix the prompt text (no chat template whatever the model has)."""
        return False

    def training_prompt_format(self, cell: Any, chat: bool, presets: dict) -> dict[str, Any]:
        """How question-answer training rows are written for a cell (`cru_harness.prompts.qa_texts` keywords)."""
        return {"chat": bool(chat), "benchmark": self.name}

    def tasks_with_data(self, cell: Any, data_dir) -> tuple[list[str], dict[str, str]]:
        """The cell's tasks its data can serve, and the reason for each one left out."""
        return list(cell.tasks), {}

    def lens_rows(self, cell: Any, data_dir) -> tuple[list[dict], str] | None:
        """The question-answer rows (and their source) whose forget probability the logit lens reads per layer
        when a run asks for it (`evaluation.logit_lens`): the forget items the cell scores. None: the benchmark
        has no forget probability to read."""
        return None

    def score(self, cell: Any, lmeval_dir: Path, *, data_dir, original_model: str | None, retain_result: dict | None,
              device: str, batch_size: int) -> dict:
        """The cell's numbers (docs/results_schema.md) from its saved lm-eval outputs."""
        raise NotImplementedError(f"{type(self).__name__}.score")
