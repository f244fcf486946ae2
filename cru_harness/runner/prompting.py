"""A cell's decisions, settled once when the plan is built (`CellDecisions`, `decide`): the protocol presets its tasks
run under, whether its prompts go through the chat template, how its training rows are written so that they match
the questions its evaluation asks, its tasks' lm-eval metadata, its method plugin, its model loader and device, and
(over the whole plan, `runner.plan.settle`) the cells it reads. Execution, the evaluation and the training phases
(and RWKU's target selection) read them instead of deciding again."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ModelSpec
from .models import load_model_of, model_dtype, resolve_device

# No import of `runner.plan`: the plan imports this module (a cell is only read here, by its attributes).


@dataclass(frozen=True)
class CellDecisions:
    """What a cell's execution reads rather than re-decides, settled once when the cell is planned (`decide`):
    its protocol presets and lm-eval settings, its tasks' lm-eval metadata and the metadata its benchmark reads about
    its model, whether its preset fixes the prompt text, the chat choice its config makes (None: the model's
    tokenizer decides, read once per checkpoint), how its training rows are written with and without the chat
    template, whether its tasks read the oracle's checkpoint as a reference model, its method plugin, and its model
    (`load_model`, `dtype`) and device (`device`: the config's, resolved the first time it is read). Over the whole
    plan (`runner.plan.settle`): the hashes of its oracle (`oracle`) and of the fine-tune it starts from
    (`starts_from`). Derived from the cell's hashed fields, so it enters no cell hash."""
    presets: dict[str, Any]
    gen_kwargs: dict[str, Any] | None
    task_metadata: dict[str, Any]
    fixed_format: bool
    chat_setting: bool | None
    formats: tuple[dict[str, Any], dict[str, Any]]   # the rows' format (plain, chat)
    model_metadata: dict[str, Any]    # `Benchmark.model_metadata` (e.g. the tokenizer a reference is cut with)
    oracle_reference: bool            # its tasks read its oracle's checkpoint (`Benchmark.oracle_as_reference`)
    method: Any                       # the method plugin whose model it serves (`Cell.method_plugin`), or None
    model: ModelSpec
    device_setting: str               # the config's device (`auto`, `cpu`, `cuda:1`)
    oracle: str | None = None         # the hash of its retain cell (Forget Quality, the reference attack)
    starts_from: str | None = None    # the hash of the finetune cell whose checkpoint its model starts from
    linked: bool = False              # `oracle` and `starts_from` were read from a plan (`runner.plan.settle`)

    @property
    def lmeval_settings(self) -> dict[str, Any]:
        """`run_lmeval`'s generation and preset arguments (`lmeval_settings(cell.evaluation)`)."""
        return {"gen_kwargs": self.gen_kwargs, "presets": self.presets}

    @functools.cached_property
    def device(self) -> str:
        """The torch device the cell runs on: resolved once, when it first runs (`models.resolve_device`; a plan
        built for `--dry-run` on a machine without the GPU resolves none)."""
        return resolve_device(self.device_setting)

    def chat(self, model_path: str) -> bool:
        """Whether the cell's prompts go through `model_path`'s chat template (`use_chat_template`)."""
        if self.fixed_format:
            return False
        if self.chat_setting is not None:
            return self.chat_setting
        return _tokenizer_has_chat_template(model_path, self.model.trust_remote_code)

    def rows(self, chat: bool) -> dict[str, Any]:
        """How its training QA rows are written (`cru_harness.prompts.qa_texts` keywords) under that chat choice."""
        return dict(self.formats[bool(chat)])

    def dtype(self, phase: str = "train") -> str:
        """Its model's dtype name in `phase` (`models.model_dtype`)."""
        return model_dtype(self.model, phase)

    def load_model(self, path: str, dtype: str | None = None):
        """(model, tokenizer) of `path` on the cell's device, or sharded by its model's `device_map`, in `dtype`
        (default: the training dtype)."""
        return load_model_of(self.model, path, self.device, dtype)


def decide(cell) -> CellDecisions:
    """A cell's decisions (`CellDecisions`), from its config alone: touches no model or tokenizer. Its oracle and
    starting model are read from the whole plan (`runner.plan.settle`)."""
    from .. import plugins

    benchmark = plugins.benchmarks.get(cell.benchmark)
    settings = lmeval_settings(cell.evaluation)
    evaluated = cell.kind != "finetune"   # a fine-tune only trains
    return CellDecisions(
        presets=settings["presets"], gen_kwargs=settings["gen_kwargs"],
        task_metadata=benchmark.task_metadata(cell.split, cell.target) if evaluated else {},
        fixed_format=bool(benchmark.fixed_prompt_format(settings["presets"])),
        chat_setting=configured_chat(cell.model, cell.evaluation),
        formats=(_prompt_format(cell, False), _prompt_format(cell, True)),
        model_metadata=benchmark.model_metadata(cell) if evaluated else {},
        oracle_reference=cell.kind not in ("retain", "finetune") and bool(benchmark.oracle_as_reference(cell.tasks)),
        method=cell.method_plugin, model=cell.model, device_setting=cell.device)


def decisions_of(cell) -> CellDecisions:
    """The decisions the plan attached to `cell` (`Cell.decisions`: a cell built by hand is decided when asked)."""
    return cell.decisions


def preset_defaults(evaluation: dict) -> dict[str, Any]:
    """The evaluation keys that are protocol presets / options of the tasks (lm-eval metadata of the same name),
    with their defaults: of each benchmark whose defaults are in every cell, or whose keys `evaluation` sets."""
    from .. import plugins

    defaults: dict[str, Any] = {}
    for plugin in plugins.benchmarks:
        if plugin.evaluation_in_every_cell or set(plugin.evaluation_defaults) & set(evaluation):
            defaults.update({key: value for key, value in plugin.evaluation_defaults.items()
                             if key in plugin.metadata_keys})
    return defaults


def __getattr__(name: str):
    """`PRESET_KEYS`: the keys of `preset_defaults({})`, read from the registry when used."""
    if name == "PRESET_KEYS":
        return tuple(preset_defaults({}))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def protocol_presets(evaluation: dict) -> dict[str, Any]:
    """The presets a run uses (defaults filled in): passed to the tasks as lm-eval metadata and recorded in every
    cell's `details.prompting`. System prompts are the tasks' own (TOFU open-unlearning: "You are a helpful
    assistant."; RWKU: none), so the runner passes no `system_instruction`."""
    return {key: evaluation.get(key, default) if evaluation.get(key) is not None else default
            for key, default in preset_defaults(evaluation).items()}


def lmeval_settings(evaluation: dict) -> dict[str, Any]:
    """The generation and preset arguments of `run_lmeval` that the config's `evaluation` block decides: one
    place, so that RWKU target selection answers the probes exactly as the cells do."""
    gen_kwargs = {"max_gen_toks": int(evaluation["max_gen_toks"])} if evaluation.get("max_gen_toks") else None
    return {"gen_kwargs": gen_kwargs, "presets": protocol_presets(evaluation)}


def use_chat_template(cell, model_path: str) -> bool:
    """Whether the cell's prompts go through the model's chat template (see `model_uses_chat_template`). Never for
    a TOFU cell whose preset and `tofu_model_family` fix the text format (legacy, or an open-unlearning model
    config without a chat template): the reference writes those prompts itself. Read from the cell's decisions
    (`CellDecisions.chat`); only an automatic choice reads `model_path`'s tokenizer, once per checkpoint."""
    return decisions_of(cell).chat(model_path)


def model_uses_chat_template(model: ModelSpec, evaluation: dict, model_path: str) -> bool:
    """Whether a model's prompts go through its chat template (protocol: a model with one gets it).

    Order: the model's `chat_template` setting, then `evaluation.apply_chat_template`, then automatic: testbed
    checkpoints (`zoo:`) are fine-tuned on the plain `Question: ...\nAnswer:` template (their tokenizer's chat
    template exists to exercise chat code paths), so they are evaluated plain; any other model uses its chat
    template when its tokenizer has one. A cell's TOFU prompts may still be fixed by its preset: `use_chat_template`.
    """
    configured = configured_chat(model, evaluation)
    if configured is not None:
        return configured
    return _tokenizer_has_chat_template(model_path, model.trust_remote_code)


def configured_chat(model: ModelSpec, evaluation: dict) -> bool | None:
    """The chat choice a config makes for a model (`model_uses_chat_template`'s order, tokenizer aside); None: its
    tokenizer decides."""
    if model.chat_template is not None:
        return bool(model.chat_template)
    if evaluation.get("apply_chat_template") is not None:
        return bool(evaluation["apply_chat_template"])
    from ..testbed.names import trained_plain

    if trained_plain(model.path):
        return False
    return None


def _tokenizer_has_chat_template(model_path: str, trust_remote_code: bool) -> bool:
    """Whether a checkpoint's tokenizer has a chat template: read once per checkpoint (a cell asks for its base
    model and its trained model, training and evaluation alike), again only when a local checkpoint's tokenizer
    files were rewritten."""
    folder = Path(model_path)
    stamp = tuple((f.name, f.stat().st_mtime_ns) for f in sorted(folder.glob("*token*"))) if folder.is_dir() else ()
    return _read_chat_template(model_path, trust_remote_code, stamp)


@functools.lru_cache(maxsize=64)
def _read_chat_template(model_path: str, trust_remote_code: bool, stamp: tuple) -> bool:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    return bool(getattr(tokenizer, "chat_template", None))


def prompt_format(cell, chat: bool) -> dict:
    """How training QA rows are written (`_prompt_format`), as the cell's decisions settled it."""
    return decisions_of(cell).rows(chat)


def _prompt_format(cell, chat: bool) -> dict:
    """How training QA rows are written (`cru_harness.prompts.qa_texts`): as the cell's evaluation asks questions
    (`chat`: `use_chat_template(cell, ...)`, which is False under a fixed TOFU format). A TOFU cell
    under its presets; an RWKU cell as RWKU's probes ask (a retain cover's neighbour questions as the neighbour-QA
    probe asks them; RWKU itself trains on passages and has no reference for question rows, docs/protocol.md)."""
    from .. import plugins

    benchmark = plugins.benchmarks.get(cell.benchmark)
    if cell.kind == "finetune":   # the fine-tune writes its rows as the benchmark whose oracle it serves asks them
        presets = protocol_presets(cell.evaluation if benchmark.has_oracle else {})
        return benchmark.finetune_prompt_format(cell, chat, presets)
    return benchmark.training_prompt_format(cell, chat, protocol_presets(cell.evaluation))
