"""`unlearn()`: run one baseline end to end — load, train through `trainer.py`, save, report resources."""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoTokenizer

from ..context import fit_to_context
from ..devices import saved_dtype
from ..errors import InputError
from ..locations import check_model_path, check_output_dir, save_checkpoint
from ..prompts import prompt_format_label
from ..training.engine import load_trainee, prepare_training, set_activation_checkpointing, train_model
from ..training.lora import AdapterOff, LoraSettings, add_lora, check_lora_method
from ..training.resources import ResourceMonitor, max_over_processes
from .base import BaselineConfig, UnlearningMethod
from .data import encode_row
from .registry import get_method

RECORD_FILE = "unlearn_record.json"


@dataclass
class UnlearnResult:
    method: str
    seed: int
    config: dict[str, Any]
    out_dir: str | None
    n_forget: int
    n_retain: int                      # retain rows used (0 when the method has no retain term)
    optimizer_steps: int
    gradient_accumulation_steps: int
    num_processes: int
    resources: dict[str, Any]          # wall time, peak memory (+ source), trainable/total parameters
    final_logs: dict[str, float]
    history: list[dict] = field(default_factory=list)
    model: torch.nn.Module | None = field(default=None, repr=False)  # the trained model (not serialised)
    # what the directory was trained from and on: `--prompt-format auto` reads `prompt_format` back (a
    # `prompts.prompt_format_label`: chat, plain or an open-unlearning model config)
    base_model: str | None = None
    prompt_format: str | None = None
    lora: dict | None = None           # the adapter's settings (`training.lora.LoraSettings`); None: all weights

    def to_dict(self) -> dict[str, Any]:   # (a full-weight run's record has no `lora` key, as before)
        return {k: v for k, v in self.__dict__.items() if k != "model" and not (k == "lora" and v is None)}


def _resolve_method(method, config) -> UnlearningMethod:
    if isinstance(method, UnlearningMethod):
        if config is not None:
            raise ValueError("pass either a method instance or (method name, config), not both")
        return method
    cls = get_method(method) if isinstance(method, str) else method
    if not (isinstance(cls, type) and issubclass(cls, UnlearningMethod)):
        raise TypeError(f"method must be a registered name, an UnlearningMethod class or instance; got {method!r}")
    return cls(config)


def unlearn(model_path_or_model, tokenizer, forget_rows: list[dict], retain_rows: list[dict] | None,
            method: str | type[UnlearningMethod] | UnlearningMethod, config: BaselineConfig | dict | None = None,
            out_dir: str | os.PathLike | None = None, seed: int = 0, *, refusals: list[str] | None = None,
            data_dir: str | os.PathLike | None = None, dtype: str | torch.dtype = "float32",
            device: str = "auto", device_map=None, progress: bool = True,
            prompt_format: dict | None = None, trust_remote_code: bool = False,
            overwrite: bool = False, lora=None, gradient_checkpointing: bool = False,
            checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int = 0) -> UnlearnResult:
    """Unlearn `forget_rows` from a model with a baseline; save it to `out_dir` (if given) and return a record.

    `prompt_format`: `{"chat": bool, "preset": ..., "family": ..., "benchmark": ...}` for
    `cru_harness.prompts.qa_texts` (default: TOFU's open-unlearning preset, the chat template when the tokenizer has
    one): pass what the evaluation uses. `trust_remote_code`: as the evaluation loads the model (its own code).
    `model_path_or_model`: a checkpoint path / hub id or a model (trained in place).
    `dtype` (`cru_harness.devices.training_precision`): float32; bfloat16 / float16 = fp32 master weights under
    bf16 / fp16 autocast (as the references' DeepSpeed runs), the trained model then cast to `dtype` and saved
    in it. A config's own `mixed_precision` other than "no" wins. A model object trains in its own dtype.
    `device` (auto, cpu, cuda, cuda:N) and `device_map` ("auto": sharded over the GPUs; a path only) say where
    it trains; under `accelerate launch` each process takes its own GPU (data parallel; no `device_map`).
    `out_dir`: checked before anything is loaded; one holding files is refused unless `overwrite` (then replaced).
    `lora` (`training.lora.LoraSettings`, its dict, or a preset name): train a LoRA adapter on the frozen base (in
    `dtype`), saved as a PEFT adapter directory; the reference is the model with the adapter off.
    `gradient_checkpointing`: the model's own (transformers'), trading compute for activation memory.
    `checkpoint_dir`, `checkpoint_every`: the engine saves its training state every k steps and a run given a
    directory holding one resumes from it (`training.engine.train_model`).
    `tokenizer`: a tokenizer, a path, or None (then loaded from the model path). Rows: `question`/`answer`
    or `text`. `retain_rows` are needed when the method's `alpha` > 0 and ignored otherwise. `refusals`
    (IdkDPO, DPO, RT): defaults to TOFU's `idontknow` list (its plugin's `refusals(data_dir)`),
    unless every forget row brings its own `alternate` answer.
    """
    m = _resolve_method(method, config)
    if not m.trains:
        raise InputError(f"{m.name} trains no model: it is scored by its task variants "
                         f"({getattr(m, 'task_variant', m.name)}) on the original model")
    # Where it will write, and what it reads, are checked before anything is loaded or trained.
    if out_dir is not None:
        check_output_dir(out_dir, what="out_dir", overwrite=overwrite, overwrite_hint="overwrite=True", staged=True)
    if isinstance(model_path_or_model, (str, os.PathLike)):
        check_model_path(str(model_path_or_model), what="model")
    lora = LoraSettings.from_dict(lora) if lora is not None else None
    if lora is not None:
        check_lora_method(m)
    m.config, accelerator = prepare_training(m.config, seed, dtype=dtype, device=device, device_map=device_map)

    def load():
        return load_trainee(str(model_path_or_model), accelerator, dtype=dtype, device=device, device_map=device_map,
                            trust_remote_code=trust_remote_code, frozen_base=lora is not None)[0]

    if isinstance(model_path_or_model, (str, os.PathLike)):
        model = load()
        if tokenizer is None:
            tokenizer = model_path_or_model
    else:
        if device_map is not None:
            raise ValueError("device_map applies to a checkpoint path; a model object is trained where it is")
        model = model_path_or_model
    if tokenizer is None:
        raise ValueError("tokenizer is required when a model object is passed")
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer, trust_remote_code=trust_remote_code)

    retain_used = list(retain_rows or []) if m.uses_retain else []
    if m.uses_retain and not retain_used:
        raise InputError(f"{m.name} with alpha={m.config.alpha} needs retain rows (or set alpha=0)")
    if m.needs_alternate:
        if refusals is None and not all(isinstance(r, dict) and r.get("alternate") for r in forget_rows):
            from cru_harness import plugins
            refusals = plugins.benchmarks.get("tofu").refusals(data_dir)
    else:
        refusals = None

    def lengths():  # only computed when max_length exceeds the model's context
        return {side: [len(encode_row(tokenizer, r, i, side, m.config.max_length, **(prompt_format or {})).input_ids)
                       for i, r in enumerate(rows)]
                for side, rows in (("forget", forget_rows), ("retain", retain_used)) if rows}

    max_length = fit_to_context(model, m.config.max_length, lengths)
    dataset = m.make_dataset(tokenizer, forget_rows, retain_used, refusals=refusals,
                             max_length=max_length, seed=seed, **(prompt_format or {}))

    if gradient_checkpointing:
        set_activation_checkpointing(model, True)
    ref_model = None
    if lora is not None:
        model = add_lora(model, lora)
        if m.needs_ref:
            ref_model = AdapterOff(model)   # the starting model: the adapter off, no second copy
    elif m.needs_ref:
        # A sharded model is loaded again with the same map (a deep copy of accelerate's hooks is not safe).
        ref_model = (load() if device_map is not None else copy.deepcopy(model)).eval().requires_grad_(False)
    trainable = [p.requires_grad for p in model.parameters()]
    with ResourceMonitor(accelerator.device, model=model) as monitor:   # counts what the method trained
        trained = train_model(model, m, dataset, ref_model=ref_model, seed=seed, accelerator=accelerator,
                              progress=progress, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every)
    for param, flag in zip(trained.model.parameters(), trainable):   # a method that trains a few (RMU): unfrozen
        param.requires_grad_(flag)
    del ref_model
    if isinstance(model_path_or_model, (str, os.PathLike)) and lora is None:
        trained.model.to(saved_dtype(dtype))   # an adapter stays in fp32 (the base was never touched)
    if gradient_checkpointing:
        set_activation_checkpointing(trained.model, False)

    result = UnlearnResult(
        method=m.name, seed=seed, config=m.config.to_dict(), out_dir=str(out_dir) if out_dir else None,
        n_forget=len(forget_rows), n_retain=len(retain_used), optimizer_steps=trained.optimizer_steps,
        gradient_accumulation_steps=trained.gradient_accumulation_steps, num_processes=trained.num_processes,
        resources=max_over_processes(monitor.record, accelerator).to_dict(), final_logs=trained.final_logs,
        history=trained.history, model=trained.model, lora=lora.to_dict() if lora is not None else None,
        base_model=str(model_path_or_model) if isinstance(model_path_or_model, (str, os.PathLike)) else None,
        prompt_format=prompt_format_label(dict(prompt_format or {}), tokenizer),
    )
    if out_dir is not None:
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            save_checkpoint(out_dir, trained.model, tokenizer, RECORD_FILE, result.to_dict(), accelerator.save)
        accelerator.wait_for_everyone()
    return result
