"""`cru-harness finetune` / `finetune()`: TOFU's fine-tuning recipe, the model TOFU unlearning starts from.

TOFU (locuslab/tofu `finetune.py`) fine-tunes a chat model on the fictitious authors' QA pairs: loss on the
answer tokens and one EOS, the question masked; AdamW lr 1e-5, weight decay 0.01, 5 epochs, effective batch
32, one warm-up epoch, linear decay. The same recipe on `retain90` gives the retain oracle of Forget Quality.

- Rows: a TOFU config (`full`, `retain90`, ...), a JSON/JSONL file of `question`/`answer` (or `text`) rows, or
  an RWKU source (`cru_harness.data.corpora.load_corpus_rows`).
- Prompt: the one the evaluation uses, built by `baselines.data.encode_qa` (the model's chat template with the
  protocol's system prompt when it has one, else `Question: {q}\\nAnswer:`); `chat_template=False` forces the
  plain template (the runner's choice for testbed models, see `runner.execute.model_uses_chat_template`).
- Training: the training engine (`training.engine.train_model`), so mixed precision, exact
  gradient accumulation and `accelerate launch` data parallelism behave as for GA/NPO/...
- The output directory is checked before any training (`cru_harness.locations.check_output_dir`): an
  existing non-empty one needs `overwrite=True`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset

from ..baselines.base import BaselineConfig, UnlearningMethod
from ..baselines.data import collate, encode_qa, own_examples, row_to_qa, training_benchmark
from ..baselines.losses import nll_loss
from ..devices import dtype_name, saved_dtype
from ..errors import InputError
from ..locations import save_checkpoint
from ..prompts import DEFAULT_TOFU_PRESET, writes_chat

RECORD_FILE = "finetune_record.json"


@dataclass
class FinetuneConfig(BaselineConfig):
    """TOFU's recipe. The defaults are BaselineConfig's, which are TOFU's; named for what it is."""


class SupervisedFinetune(UnlearningMethod):
    """Answer-token NLL on the training rows: the baselines' loop with a plain fine-tuning loss (not registered
    as an unlearning method)."""

    name = "finetune"
    progress_label = "finetune"
    Config = FinetuneConfig

    def compute_loss(self, model, batch, ref_model=None):
        loss, value = nll_loss(model, batch["train"])
        return loss, {"loss": float(loss.detach()), "nll": value}


class QADataset(Dataset):
    """Rows encoded once with the evaluation's prompt (`baselines.data.encode_qa`, i.e. `cru_harness.prompts`);
    items are `{"train": EncodedExample}`. `chat`, `preset`, `family`: as `prompts.qa_texts` takes them.
    `benchmark`: the benchmark the rows come from; where it builds its own training examples
    (`api.Benchmark.training_examples`: MUSE's blocks of its joined texts) those are trained on, as the unlearning
    methods train on them, instead of one example per row."""

    def __init__(self, tokenizer, rows, *, max_length: int = 512, chat: bool | None = None,
                 preset: str = DEFAULT_TOFU_PRESET, family: str | None = None, benchmark: str | None = None):
        if not rows:
            raise InputError("finetune: no training rows")
        if chat is True and not getattr(tokenizer, "chat_template", None):
            raise InputError("finetune: chat_template=True but the tokenizer has no chat template")
        fmt = {"chat": chat, "preset": preset, "family": family}
        self.chat = writes_chat(tokenizer, **fmt)   # recorded: whether the rows went through the chat template
        own = own_examples(training_benchmark(benchmark), tokenizer, rows, "training", max_length)
        self.examples = own if own is not None else [encode_qa(tokenizer, *row_to_qa(r, i), max_length, **fmt)
                                                     for i, r in enumerate(rows)]
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict:
        return {"train": self.examples[i]}

    def collate(self, items) -> dict:
        return {"train": collate([it["train"] for it in items], self.pad_token_id)}


@dataclass
class FinetuneResult:
    config: dict[str, Any]
    data: str
    n_rows: int
    seed: int
    out_dir: str | None
    optimizer_steps: int
    gradient_accumulation_steps: int
    num_processes: int
    warmup_steps: int
    chat_template: bool
    dtype: str
    resources: dict[str, Any]
    final_logs: dict[str, float]
    preset: str = DEFAULT_TOFU_PRESET   # the prompt format beside `chat_template` (`prompts.qa_texts`)
    family: str | None = None
    history: list[dict] = field(default_factory=list)
    model: torch.nn.Module | None = field(default=None, repr=False)
    lora: dict | None = None   # a LoRA run's adapter settings (a full-weight run's record has no `lora` key)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "model" and not (k == "lora" and v is None)}


def finetune(model, data, out_dir: str | os.PathLike | None = None, *, tokenizer=None,
             config: FinetuneConfig | dict | None = None, seed: int = 0, data_dir=None, dtype="float32",
             device: str = "auto", device_map=None, chat_template: bool | None = None, overwrite: bool = False,
             progress: bool = True, preset: str = DEFAULT_TOFU_PRESET, family: str | None = None,
             trust_remote_code: bool = False, lora=None, gradient_checkpointing: bool = False,
             benchmark: str | None = None) -> FinetuneResult:
    """Fine-tune a causal LM on QA rows with TOFU's recipe; save it to `out_dir` (if given).

    `model`: a HF id / directory, or a model object (trained in place; then `tokenizer` is required).
    `data`: a corpus source (TOFU config, JSON/JSONL file, rwku:...) or a list of row dicts.
    `config`: a `FinetuneConfig` or a dict of overrides of TOFU's defaults. `dtype`, `device`, `device_map`:
    as `cru_harness.baselines.unlearn` (fp32 master weights under bf16 / fp16 autocast, saved in `dtype`;
    sharded with device_map="auto").
    `chat_template` (None: when the tokenizer has one), `preset`, `family`: the prompt format
    (`cru_harness.prompts.qa_texts`); pass what the evaluation uses. `lora`, `gradient_checkpointing`: as
    `cru_harness.baselines.unlearn` (a PEFT adapter on the frozen base; the model's activation checkpointing).
    `benchmark`: the registered benchmark the rows come from, where it builds its own training examples
    (MUSE: its texts joined and cut into `max_length`-token blocks, as its unlearning methods train; `QADataset`).
    """
    from accelerate.state import PartialState

    from ..training.resources import ResourceMonitor, max_over_processes
    from ..training.engine import load_trainee, prepare_training, set_activation_checkpointing, train_model
    from ..training.lora import LoraSettings, add_lora
    from ..context import fit_to_context
    from ..locations import check_model_path, check_output_dir

    # Where it will write, and what it reads, are checked before anything is loaded or trained.
    if out_dir is not None:
        out = check_output_dir(out_dir, what="--out", overwrite=overwrite, staged=True)
    base_model = str(model) if isinstance(model, (str, os.PathLike)) else None
    if base_model is not None:
        check_model_path(base_model, what="--model")
    if config is None:
        config = FinetuneConfig()
    elif isinstance(config, dict):
        config = FinetuneConfig.from_dict(config)
    if isinstance(data, (str, os.PathLike)):
        from ..data.corpora import load_corpus_rows

        rows, description = load_corpus_rows(data, data_dir)
    else:
        rows, description = list(data), f"{len(data)} rows given"
    lora = LoraSettings.from_dict(lora) if lora is not None else None
    config, accelerator = prepare_training(config, seed, dtype=dtype, device=device, device_map=device_map)
    loaded = isinstance(model, (str, os.PathLike))  # a model object trains, and stays, in its own dtype
    if loaded:
        model, loaded_tokenizer = load_trainee(str(model), accelerator, dtype=dtype, device=device,
                                               device_map=device_map, trust_remote_code=trust_remote_code,
                                               load_tokenizer=tokenizer is None, frozen_base=lora is not None,
                                               precision=config.precision)
        tokenizer = tokenizer or loaded_tokenizer
    elif tokenizer is None:
        raise ValueError("finetune: a tokenizer is required when a model object is passed")
    if isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer, trust_remote_code=trust_remote_code)
    def lengths():  # only computed when max_length exceeds the model's context (as the baselines do)
        return {"training": [len(e.input_ids) for e in QADataset(tokenizer, rows, max_length=config.max_length,
                                                                 **fmt).examples]}

    fmt = {"chat": chat_template, "preset": preset, "family": family, "benchmark": benchmark}
    max_length = fit_to_context(model, config.max_length, lengths)
    dataset = QADataset(tokenizer, rows, max_length=max_length, **fmt)
    method = SupervisedFinetune(config)
    if gradient_checkpointing:
        set_activation_checkpointing(model, True)
    if lora is not None:
        model = add_lora(model, lora)
    with ResourceMonitor(accelerator.device, model=model) as monitor:
        trained = train_model(model, method, dataset, seed=seed, accelerator=accelerator, progress=progress)
    if gradient_checkpointing:
        set_activation_checkpointing(trained.model, False)
    if loaded and lora is None:   # an adapter stays in fp32
        trained.model.to(saved_dtype(dtype))
    result = FinetuneResult(
        config=config.to_dict(), data=description, n_rows=len(rows), seed=seed,
        out_dir=str(out_dir) if out_dir is not None else None, optimizer_steps=trained.optimizer_steps,
        gradient_accumulation_steps=trained.gradient_accumulation_steps, num_processes=trained.num_processes,
        warmup_steps=trained.warmup_steps, chat_template=dataset.chat,
        dtype=dtype_name(saved_dtype(dtype) if loaded else trained.model.dtype),
        resources=max_over_processes(monitor.record, accelerator).to_dict(), final_logs=trained.final_logs,
        preset=preset, family=family, history=trained.history, model=trained.model,
        lora=lora.to_dict() if lora is not None else None)
    if out_dir is not None:
        accelerator.wait_for_everyone()
        if PartialState().is_main_process:
            # the record also names the base, the method and the prompt format (`--prompt-format auto` reads it)
            record = {**result.to_dict(), "base_model": base_model, "method": "finetune",
                      "prompt_format": "chat" if dataset.chat else (family or "plain")}
            save_checkpoint(out, trained.model, tokenizer, RECORD_FILE, record, accelerator.save)
        accelerator.wait_for_everyone()
    return result


