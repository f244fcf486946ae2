"""The experiment config's keys, declared once (pydantic, `extra="forbid"`): what each block may hold and what each
key means. Three readers: `validate_config` refuses an unknown key through them (one line naming it, the keys
allowed there, a near miss suggested), `cru-harness config-schema` prints the JSON schema editors validate against,
and docs/configs.md's key table is generated from the descriptions (`key_table`; a test keeps them equal).

A key's own value rules (a name's characters, a choice of dtypes, a YAML boolean, the seeds) are declared here too,
as validators raising `RuleError` with the one-line message `check_values` reports under the key; the rules that
combine keys or read the registry stay in `runner.config`, whose messages name the key; a benchmark's
block and its `evaluation:` keys are its plugin's (`Benchmark.config_keys`, `Benchmark.evaluation_defaults`), and a
method entry's hyperparameters its method's (`Method.hparams`)."""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from ..devices import DTYPE_NAMES
from ..errors import excerpt
from ..hparams import seed_problem
from ..validation import _fail, _suggest


class RuleError(ValueError):
    """A key's value breaks its rule: `message` is the one line reported under the key (`at`: under one of its
    items, e.g. `[2]` of a list)."""

    def __init__(self, message: str, at: str = ""):
        super().__init__(message)
        self.message, self.at = message, at


def _boolean(value: Any, allow_none: bool = False) -> Any:
    """A YAML boolean, nothing else: `"false"` (a string) or 0 must never read as a setting (`bool("false")` is
    True, which would turn trust_remote_code on)."""
    if isinstance(value, bool) or (allow_none and value is None):
        return value
    expected = "true, false or null" if allow_none else "true or false"
    raise RuleError(f"expected {expected} (a YAML boolean, unquoted), got {value!r}")


def _dtype(value: Any, allow_none: bool = False) -> Any:
    if (allow_none and value is None) or value in DTYPE_NAMES:
        return value
    raise RuleError(f"expected one of {', '.join(DTYPE_NAMES)}, got {value!r}")


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Finetune(_Block):
    """`finetune:` (a model's, or its retain oracle's): the fine-tuning recipe's settings."""
    data: str | None = Field(None, description="corpus source to fine-tune on")
    learning_rate: float | None = None
    lr: float | None = Field(None, description="alias of learning_rate")
    weight_decay: float | None = None
    num_epochs: float | None = None
    epochs: float | None = Field(None, description="alias of num_epochs")
    effective_batch_size: int | None = None
    batch_size: int | None = Field(None, description="alias of effective_batch_size")
    micro_batch_size: int | None = None
    warmup_epochs: float | None = None
    lr_scheduler: str | None = None
    max_length: int | None = None
    dtype: str | None = None


class RetainTrain(_Block):
    """`retain: {train: ...}`: the testbed's small training loop."""
    from_: str | None = Field(None, alias="from", description="corpus source the oracle trains on")
    epochs: float | None = None
    lr: float | None = None
    batch_size: int | None = None
    max_length: int | None = None
    weight_decay: float | None = None


class Retain(_Block):
    """One retain oracle: exactly one kind."""
    checkpoint: str | None = Field(None, description="a retain model: path or Hub id")
    per_item: str | None = Field(None, description="a per-item file of the retain model's scores")
    train: RetainTrain | None = None
    finetune: Finetune | None = None


class ModelEntry(_Block):
    name: str = Field(description="row name of the model")
    path: str = Field(description="Hub id, local dir, `zoo:<arch>[:<variant>]`, `smollm2`")
    dtype: str | None = Field(None, description="training and loading dtype; `auto`, the default: the checkpoint's own")
    eval_dtype: str | None = Field(None, description="scoring dtype, default `dtype`")
    benchmarks: str | list[str] | None = Field(None, description="the configured benchmarks it runs, default all")
    retain: Retain | dict[str, Retain] | None = Field(
        None, description="the oracle of a benchmark that has one: a kind, or a mapping unit -> kind")
    chat_template: bool | None = None
    trust_remote_code: bool = False
    device_map: Literal["auto"] | None = Field(None, description="`auto`: sharded over the visible GPUs; not hashed")
    finetune: Finetune | None = Field(None, description="fine-tune `path` first, in a `finetune` cell every other "
                                                        "cell of the model starts from")

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_rule(cls, value):
        return _dtype(value)

    @field_validator("eval_dtype", mode="before")
    @classmethod
    def _eval_dtype_rule(cls, value):
        return _dtype(value, allow_none=True)

    @field_validator("chat_template", mode="before")
    @classmethod
    def _chat_template_rule(cls, value):
        return _boolean(value, allow_none=True)

    @field_validator("trust_remote_code", mode="before")
    @classmethod
    def _trust_remote_code_rule(cls, value):
        return _boolean(value)

    @field_validator("device_map", mode="before")
    @classmethod
    def _device_map_rule(cls, value):
        if value not in (None, "auto"):
            raise RuleError(f"expected auto (shard over the visible GPUs) or null, got {value!r}")
        return value


class MethodEntry(BaseModel):
    """A `methods:` entry; its other keys are the method's hyperparameters (and its `entry_settings`)."""
    model_config = ConfigDict(extra="allow")
    method: str = Field(description="a registered method or another name of it: `cru-harness methods`")
    label: str | None = Field(None, description="row name, default the method's name")
    benchmarks: str | list[str] | None = None
    overrides: dict[str, dict[str, Any]] | None = Field(None, description="{benchmark or unit: {hparam: value}}")
    forget_corpus: str | None = None
    retain_corpus: str | None = None
    as_computed: dict[str, Any] | None = Field(
        None, description="{hparam: value}: a committed run's former defaults, restated (each must equal the "
                          "method's `former_defaults`); they train its cells and stay out of their hashes, which "
                          "predate them")


class AttackEntry(BaseModel):
    """An `attacks:` entry; its other keys are the attack's settings."""
    model_config = ConfigDict(extra="allow")
    attack: str = Field(description="a registered attack: `cru-harness attacks`")
    label: str | None = None


class Report(_Block):
    formats: list[Literal["md", "csv", "tex"]] | None = None
    plots: bool | None = None
    stats: bool | None = None


class Training(_Block):
    """`training:`: how weight-training cells run (`training.launch.LaunchSettings` checks the values)."""
    engine: Literal["none", "ddp", "fsdp", "zero3"] | None = Field(
        None, description="`none` (default: in the runner's process), `ddp`, `fsdp`, `zero3`: each weight-training "
                          "and finetune cell runs under `accelerate launch` with configs/accelerate/ENGINE.yaml")
    num_processes: int | None = Field(None, description="processes (one per GPU); default 1")
    config_file: str | None = Field(None, description="an accelerate config file of one's own instead of the engine's")


class Tuning(_Block):
    """`tuning:`: each method's hyperparameters chosen by one named rule on a validation unit, before any reported
    cell runs (`runner.tuning`, docs/protocol.md "Tuning")."""
    rule: str = Field(description="the selection rule, one of `runner.tuning.RULES`: `forgetting_at_utility`, "
                                  "`forget_quality_at_utility`")
    utility_ratio: float = Field(0.9, description="r: a setting qualifies when its validation utility is >= r x the "
                                                  "Original's")
    validation: dict[str, dict[str, Any] | None] = Field(
        description="the validation unit(s): benchmark blocks as under `benchmarks:`; no item shared with a "
                    "reported unit")
    retain: dict[str, Any] | None = Field(None, description="the validation unit's oracle, as `models[i].retain` "
                                                            "(a benchmark with an oracle)")
    seeds: int | list[int] | None = Field(None, description="the validation cells' seeds (default: the run's first)")
    methods: list[str] | None = Field(None, description="the labels tuned (default: every entry whose method has "
                                                        "a default grid, docs/protocol.md \"Tuning\")")
    grids: dict[str, dict[str, list[Any]]] | None = Field(
        None, description="{label: {hparam: [values]}}: a label's grid instead of its method's default")
    overrides: dict[str, Any] | None = Field(
        None, description="{hparam: value} set in every validation cell whose method accepts it (e.g. a batch that "
                          "keeps the reported step count on a smaller validation unit)")


class ExperimentFile(_Block):
    """A runner config (`cru-harness run CONFIG`)."""
    name: str = Field(description="run name (letters, digits, `_ . -`)")
    output_dir: str | None = Field(None, description="run directory (default `results/<name>`)")
    data_dir: str | None = Field(None, description="default local data root of every benchmark (else its "
                                                   "environment variable, else the Hub)")
    seeds: int | list[int] = Field(
        [0], description="distinct ints from 0 to 2**32 − 1; trained methods run once per seed (unseeded methods "
                         "and the oracles once)")
    device: str = Field("auto", description="`auto` (CUDA when present, else CPU), `cpu`, `cuda`, `cuda:N`, `mps`; "
                                            "checked when the config is read, resolved when a cell runs")
    include_original: bool = Field(True, description="evaluate each model before unlearning: the reference row")
    models: list[ModelEntry] = Field(description="the models: `models[i]` below")
    benchmarks: dict[str, dict[str, Any] | None] = Field(
        description="one block per benchmark (`cru-harness benchmarks`); its keys are its plugin's: the next table")
    methods: list[str | MethodEntry] = Field(description="the methods: a name or `methods[i]` below")
    attacks: list[str | AttackEntry] | None = Field(
        None, description="attacks applied to every method cell and the retain oracle: a name or "
                          "`{attack: NAME, label: ..., <its settings>}`")
    evaluation: dict[str, Any] | None = Field(
        None, description="`batch_size`, `limit`, `max_gen_toks`, `failure_classes`, `apply_chat_template`, "
                          "`logit_lens`, and each benchmark's own keys (the next table)")
    report: Report | None = Field(None, description="`formats` (md, csv, tex), `plots`, `stats`")
    description: str | None = Field(None, description="free text, shown in the report")
    training: Training | None = Field(None, description="`{engine, num_processes, config_file}`: the training engine "
                                                        "of weight-training cells; in no cell's hash (docs/gpu.md)")
    tuning: Tuning | None = Field(None, description="each method's hyperparameters chosen on a validation unit by "
                                                    "one rule: `tuning.*` below")

    @field_validator("name", mode="before")
    @classmethod
    def _name_rule(cls, value):
        if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
            raise RuleError(f"expected a simple name (letters, digits, _ . -), got {value!r}")
        return value

    @field_validator("output_dir", mode="before")
    @classmethod
    def _output_dir_rule(cls, value):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise RuleError(f"expected a directory path, got {excerpt(value)}")
        return value

    @field_validator("data_dir", mode="before")
    @classmethod
    def _data_dir_rule(cls, value):
        if value is not None and not isinstance(value, str):
            raise RuleError(f"expected a path, got {value!r}")
        return value

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds_rule(cls, value):
        seeds = [value] if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(seeds, list) or not seeds:
            raise RuleError(f"expected a non-empty list of integers, got {seeds!r}")
        for i, seed in enumerate(seeds):
            if problem := seed_problem(seed):
                raise RuleError(problem, at=f"[{i}]")
        if len(set(seeds)) != len(seeds):
            raise RuleError(f"repeats a seed: {seeds}")
        return value

    @field_validator("include_original", mode="before")
    @classmethod
    def _include_original_rule(cls, value):
        return _boolean(value)


def allowed_keys(model: type[BaseModel]) -> tuple[str, ...]:
    """The keys a block declared by `model` may hold, in declaration order (a field's alias where it has one)."""
    return tuple(f.alias or name for name, f in model.model_fields.items())


def check_keys(model: type[BaseModel], mapping: Any, where: str, source: str | None) -> dict:
    """Refuse the first key of `mapping` that `model` does not declare (pydantic's `extra_forbidden`), in one line
    naming it and the keys allowed there. Only this block's own keys: nested blocks are checked where they are read,
    and the values' rules are `runner.config`'s."""
    if not isinstance(mapping, dict):
        _fail(where, f"expected a mapping, got {type(mapping).__name__}", source)
    try:
        model.model_validate(mapping)
    except ValidationError as err:
        extra = {e["loc"][0] for e in err.errors() if e["type"] == "extra_forbidden" and len(e["loc"]) == 1}
        for key in mapping:
            if key in extra:
                allowed = allowed_keys(model)
                path = f"{where}.{key}" if where else str(key)
                _fail(path, f"unknown key{_suggest(str(key), allowed)}; allowed here: {', '.join(allowed)}", source)
    return mapping


def check_values(model: type[BaseModel], mapping: dict, where: str, source: str | None) -> dict:
    """Refuse the first of this block's own keys (in declaration order) whose value breaks its declared rule
    (`RuleError`), in its one line under the key. Keys and nested blocks are checked elsewhere (`check_keys`)."""
    try:
        model.model_validate(mapping)
    except ValidationError as err:
        broken = {e["loc"][0]: e["ctx"]["error"] for e in err.errors()
                  if len(e["loc"]) == 1 and isinstance((e.get("ctx") or {}).get("error"), RuleError)}
        for name, f in model.model_fields.items():
            key = f.alias or name
            if key in broken:
                rule = broken[key]
                _fail(f"{where}.{key}{rule.at}" if where else f"{key}{rule.at}", rule.message, source)
    return mapping


def config_schema(evaluation_keys: tuple[str, ...]) -> dict[str, Any]:
    """The JSON schema of a runner config with the registered benchmarks' blocks and the `evaluation:` keys
    (`runner.config.evaluation_keys()`: the generic ones and each benchmark's)."""
    from .. import plugins

    blocks = {b.name: (create_model(f"Benchmark_{b.name}", __config__=ConfigDict(extra="forbid"),
                                    **{key: (Any, None) for key in b.config_keys}) | None, None)
              for b in plugins.benchmarks}
    benchmarks = create_model("Benchmarks", __config__=ConfigDict(extra="forbid"), **blocks)
    evaluation = create_model("Evaluation", __config__=ConfigDict(extra="forbid"),
                              **{key: (Any, None) for key in evaluation_keys})
    schema_model = create_model("ExperimentConfig", __base__=ExperimentFile,
                                benchmarks=(benchmarks, Field(description=ExperimentFile.model_fields[
                                    "benchmarks"].description)),
                                evaluation=(evaluation | None, Field(None, description=ExperimentFile.model_fields[
                                    "evaluation"].description)))
    schema = schema_model.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "cru-harness experiment config"
    return schema


def _keys_of(model: type[BaseModel]) -> str:
    """`key` (what it is), ... of a block, in declaration order."""
    return ", ".join(f"`{f.alias or name}`" + (f" ({f.description})" if f.description else "")
                     for name, f in model.model_fields.items())


def key_table() -> str:
    """docs/configs.md's table of the config's keys, from the declarations above (Markdown)."""
    rows = [(f.alias or name, f.description or "") for name, f in ExperimentFile.model_fields.items()
            if name not in ("models", "methods")]
    rows[6:6] = [("models[i]", _keys_of(ModelEntry)),
                 ("models[i].retain", f"one of {_keys_of(Retain)}; `train`: {_keys_of(RetainTrain)}; `finetune`: "
                                      "as `models[i].finetune`; or a mapping unit -> one of those"),
                 ("models[i].finetune", _keys_of(Finetune))]
    rows[10:10] = [("methods[i]", f"{_keys_of(MethodEntry)}, and the method's hyperparameters and entry settings "
                                  "(`cru-harness methods`)")]
    rows += [(f"tuning.{key}", text) for key, text in
             ((f.alias or name, f.description or "") for name, f in Tuning.model_fields.items())]
    lines = ["| key | meaning |", "|---|---|"] + [f"| `{key}` | {text.replace('|', '&#124;')} |" for key, text in rows]
    return "\n".join(lines) + "\n"
