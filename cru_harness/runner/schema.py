"""The experiment config's keys, declared once (pydantic, `extra="forbid"`): what each block may hold and what each
key means. Three readers: `validate_config` refuses an unknown key through them (one line naming it, the keys
allowed there, a near miss suggested), `cru-harness config-schema` prints the JSON schema editors validate against,
and docs/configs.md's key table is generated from the descriptions (`key_table`; a test keeps them equal).

The values' rules (ranges, paths, combinations) stay in `runner.config`, whose messages name the key; a benchmark's
block and its `evaluation:` keys are its plugin's (`Benchmark.config_keys`, `Benchmark.evaluation_defaults`), and a
method entry's hyperparameters its method's (`Method.hparams`)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from ..validation import _fail, _suggest


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


class MethodEntry(BaseModel):
    """A `methods:` entry; its other keys are the method's hyperparameters (and its `entry_settings`)."""
    model_config = ConfigDict(extra="allow")
    method: str = Field(description="a registered method or another name of it: `cru-harness methods`")
    label: str | None = Field(None, description="row name, default the method's name")
    benchmarks: str | list[str] | None = None
    overrides: dict[str, dict[str, Any]] | None = Field(None, description="{benchmark or unit: {hparam: value}}")
    forget_corpus: str | None = None
    retain_corpus: str | None = None


class AttackEntry(BaseModel):
    """An `attacks:` entry; its other keys are the attack's settings."""
    model_config = ConfigDict(extra="allow")
    attack: str = Field(description="a registered attack: `cru-harness attacks`")
    label: str | None = None


class Report(_Block):
    formats: list[Literal["md", "csv", "tex"]] | None = None
    plots: bool | None = None
    stats: bool | None = None


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
    lines = ["| key | meaning |", "|---|---|"] + [f"| `{key}` | {text.replace('|', '&#124;')} |" for key, text in rows]
    return "\n".join(lines) + "\n"
