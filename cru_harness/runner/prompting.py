"""A cell's prompt decisions, one place for the evaluation and the training phases (and RWKU's target selection):
the protocol presets its tasks run under, whether its prompts go through the chat template, and how its training
rows are written so that they match the questions its evaluation asks."""
from __future__ import annotations

from typing import Any

from .config import ModelSpec
from .plan import Cell


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


def use_chat_template(cell: Cell, model_path: str) -> bool:
    """Whether the cell's prompts go through the model's chat template (see `model_uses_chat_template`). Never for
    a TOFU cell whose preset and `tofu_model_family` fix the text format (legacy, or an open-unlearning model
    config without a chat template): the reference writes those prompts itself."""
    from .. import plugins

    if plugins.benchmarks.get(cell.benchmark).fixed_prompt_format(protocol_presets(cell.evaluation)):
        return False
    return model_uses_chat_template(cell.model, cell.evaluation, model_path)


def model_uses_chat_template(model: ModelSpec, evaluation: dict, model_path: str) -> bool:
    """Whether a model's prompts go through its chat template (protocol: a model with one gets it).

    Order: the model's `chat_template` setting, then `evaluation.apply_chat_template`, then automatic: testbed
    checkpoints (`zoo:`) are fine-tuned on the plain `Question: ...\nAnswer:` template (their tokenizer's chat
    template exists to exercise chat code paths), so they are evaluated plain; any other model uses its chat
    template when its tokenizer has one. A cell's TOFU prompts may still be fixed by its preset: `use_chat_template`.
    """
    if model.chat_template is not None:
        return bool(model.chat_template)
    if evaluation.get("apply_chat_template") is not None:
        return bool(evaluation["apply_chat_template"])
    from ..testbed.names import trained_plain

    if trained_plain(model.path):
        return False
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=model.trust_remote_code)
    return bool(getattr(tokenizer, "chat_template", None))


def prompt_format(cell: Cell, chat: bool) -> dict:
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
