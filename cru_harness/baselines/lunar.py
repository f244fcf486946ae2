"""LUNAR (Shen et al. 2025, "LUNAR: LLM Unlearning via Neural Activation Redirection").

r = mean over refusal prompts of h_L(last prompt token) - mean over the forget prompts of the same, h_L the output
of decoder block `layer` of the starting model; then the MLP down projection of block `layer` (its only trained
weight) is fitted so that its output m_L on the prompt tokens is redirected:
forget term = mean_{forget prompt tokens t} (1/d) ||m_L(x)_t - (m_L^ref(x)_t + coeff * r)||^2
retain term = mean_{retain prompt tokens t} (1/d) ||m_L(x)_t - m_L^ref(x)_t||^2
loss = forget_weight * forget term + alpha * retain term, m_L^ref the frozen starting model's MLP output.

What follows LUNAR's code (facebookresearch/LUNAR run_lunar.py, src/generate_directions.py,
src/dataset_utils.py, src/estimated_net_utils.py; open-unlearning src/trainer/unlearn/lunar.py ports it):
the direction (mean difference at the last prompt position, refusal minus forget, `positions: -1`, read at
the input of block L+1 = the output of block L); the target (the block's output plus coeff * r, less the
residual entering the MLP: the MLP output plus coeff * r); every token of a question with its chat template, the
answer not used (`instructions_only`); an MSE over tokens and coordinates; only `mlp.down_proj.weight` of the
layer trained; the defaults of config/forget.yaml (layer 22 of a 32-block model such as Llama-3-8B-Instruct,
coeff +2.0, lr 0.01, 20 epochs) and the learning rate decayed by 0.9 every epoch (ExponentialLR), torch AdamW
(weight decay 0.01), no clipping. The prompts the model refuses are LUNAR's dataset/splits/harmful.json (a
harmful-instruction set, not shipped in its repository): pass yours as `refusal_prompts_path`.

What differs, from the structure of this trainer: LUNAR fits a copy of the down projection on cached
activations, forget and retain tokens pooled in shuffled batches of 64 tokens (every token weighted alike); here
the whole model runs on batches of rows, a forget row paired with a retain row, the two terms token means
weighted by `alpha` (1: alike when forget and retain prompts have equal token counts). The MLP's input at the
layer does not change while only its down projection trains, so the fitted map is the same problem. One layer:
LUNAR's list of layers fits each on the starting model's activations, which training several layers at once in
one model would not reproduce.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from ..cru.blocks import find_decoder_blocks
from ..cru.sites import mlp_down_projection
from ..data.corpora import row_prompt
from ..errors import InputError, MissingInputError
from ..hparams import bound_problem
from ._activations import block_output, capture_output, decoder_block
from .base import RetainConfig, UnlearningMethod
from ..prompts import qa_texts
from .data import IGNORE_INDEX, row_to_qa
from .losses import default_counts, group_mean
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class LUNARConfig(RetainConfig):
    layer: int = 22                       # LUNAR config/forget.yaml layer_modified [22]
    coeff: float = 2.0                    # coeff_list [+2.0]
    lr_decay: float = 0.9                 # ExponentialLR gamma, per epoch
    refusal_prompts_path: str | None = None   # prompts the model refuses (LUNAR: dataset/splits/harmful.json)
    learning_rate: float = 0.01
    num_epochs: int = 20
    warmup_epochs: float = 0.0
    lr_scheduler: str = "constant"        # replaced by the per-epoch decay (`make_scheduler`)
    effective_batch_size: int = 4
    micro_batch_size: int = 4
    max_grad_norm: float | None = None
    _PRESETS: ClassVar = {("rwku", None): dict(num_epochs=20, lr_scheduler="constant", warmup_steps=None,
                                               weight_decay=0.01)}

    def __post_init__(self):
        super().__post_init__()
        for name, rule in (("layer", dict(low=0, integer=True)), ("coeff", dict()),
                           ("lr_decay", dict(above=0, high=1))):
            if problem := bound_problem(getattr(self, name), **rule):
                raise InputError(f"{name}: {problem}")


def read_prompts(path: str) -> list[str]:
    """Prompts from a JSON list (strings, or objects with `instruction` / `question` / `prompt`) or JSON lines."""
    file = Path(path)
    if not file.is_file():
        raise MissingInputError(f"refusal_prompts_path {path!r} does not exist")
    text = file.read_text()
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    prompts = []
    for row in rows if isinstance(rows, list) else []:
        value = row if isinstance(row, str) else next(
            (row[k] for k in ("instruction", "question", "prompt") if isinstance(row, dict) and k in row), None)
        if not isinstance(value, str) or not value:
            raise InputError(f"{path}: each prompt must be a string or have an instruction / question / prompt")
        prompts.append(value)
    if not prompts:
        raise InputError(f"{path}: expected a non-empty list of prompts")
    return prompts


def prompt_ids(tokenizer, question: str, fmt: dict, row: dict | None = None) -> list[int]:
    """The token ids of `question`'s prompt as training and evaluation write it (`prompts.qa_texts`)."""
    texts = qa_texts(tokenizer, question, "", **fmt, **(row_prompt(row) if row else {}))
    return list(tokenizer(texts.prompt, add_special_tokens=texts.add_special_tokens)["input_ids"])


@torch.no_grad()
def mean_last_prompt_activation(model, prompts: list[list[int]], layer: int) -> torch.Tensor:
    """Mean over `prompts` (token ids) of block `layer`'s output at each prompt's last token (float64), one
    prompt at a time (no padding, as LUNAR's batches of 1)."""
    device = next(model.parameters()).device
    total = None
    for ids in prompts:
        inputs = {"input_ids": torch.tensor([ids], device=device),
                  "attention_mask": torch.ones(1, len(ids), dtype=torch.long, device=device)}
        last = block_output(model, inputs, layer, grad=False)[0, -1].double()
        total = last if total is None else total + last
    return total / len(prompts)


def prompt_positions(inputs: dict) -> torch.Tensor:
    """[B, T] mask of the rows' prompt tokens (attended, not answer)."""
    return inputs["attention_mask"].bool() & (inputs["labels"] == IGNORE_INDEX)


@register_method
class LUNAR(UnlearningMethod):
    name = "lunar"
    Config = LUNARConfig
    needs_ref = True
    needs_retain = True
    direction: torch.Tensor | None = None

    def _down_projection(self, model):
        return mlp_down_projection(decoder_block(model, self.config.layer), self.config.layer)

    def trained_weights(self) -> str:
        return f"block {self.config.layer}'s MLP down projection"

    def trainable_parameters(self, model):
        path, blocks = find_decoder_blocks(model)
        decoder_block(model, self.config.layer)   # a clear error for a layer the model lacks
        target = self._down_projection(model)
        block = blocks[self.config.layer]
        name = next(n for n, m in block.named_modules() if m is target)
        return [f"{path}.{self.config.layer}.{name}.weight"]

    def prepare(self, model, seed: int, dataset=None) -> None:
        """The refusal direction r at `layer`, from the starting model (before any step)."""
        if self.config.refusal_prompts_path is None:
            raise InputError("lunar needs prompts the model refuses (LUNAR's dataset/splits/harmful.json): set "
                             "refusal_prompts_path")
        if dataset is None:
            raise ValueError("lunar.prepare needs the training dataset (its forget prompts)")
        tok, fmt = dataset.tokenizer, dataset.format
        refusal = [prompt_ids(tok, q, fmt) for q in read_prompts(self.config.refusal_prompts_path)]
        forget = []
        for i, row in enumerate(dataset.forget_rows):
            question = row_to_qa(row, i, "forget")[0]
            if not question:
                raise InputError("lunar redirects question prompts: forget rows must have a question (not text)")
            forget.append(prompt_ids(tok, question, fmt, row))
        self.set_direction(mean_last_prompt_activation(model, refusal, self.config.layer)
                           - mean_last_prompt_activation(model, forget, self.config.layer))

    def set_direction(self, direction: torch.Tensor) -> None:
        self.direction = direction.float().cpu()

    def make_scheduler(self, optimizer, total_steps, warmup_steps, steps_per_epoch):
        decay = self.config.lr_decay
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: decay ** math.floor(step / steps_per_epoch))

    def group_counts(self, key, inputs):
        return {**default_counts(inputs), "prompt_tokens": prompt_positions(inputs).sum()}

    def _term(self, model, ref_model, inputs, shift):
        with capture_output(self._down_projection(model)) as seen:
            model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        with torch.no_grad(), capture_output(self._down_projection(ref_model)) as frozen:
            ref_model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        out = seen[0].float()
        target = frozen[0].float().to(out.device) + shift.to(out.device)
        mask = prompt_positions(inputs).to(out.device)
        summed = ((out - target).pow(2).mean(-1) * mask).sum()
        return group_mean(summed, mask.sum(), inputs, "prompt_tokens"), float((summed / mask.sum()).detach())

    def compute_loss(self, model, batch, ref_model=None):
        if self.direction is None:
            raise RuntimeError("lunar: call prepare(model, seed, dataset) first (the trainer does) for the direction")
        if ref_model is None:
            raise ValueError("lunar needs a reference model (a frozen copy of the starting model)")
        logs: dict[str, float] = {}
        term, logs["lunar_forget"] = self._term(model, ref_model, batch["forget"], self.config.coeff * self.direction)
        loss = self.config.forget_weight * term
        if self.uses_retain:
            if "retain" not in batch:
                raise InputError(f"lunar: alpha={self.config.alpha} but the batch has no retain examples")
            term, logs["lunar_retain"] = self._term(model, ref_model, batch["retain"], torch.zeros(()))
            loss = loss + self.config.alpha * term
        logs["loss"] = float(loss.detach())
        return loss, logs


#: The runner's view of it (entry point `cru_harness.methods`: LUNAR).
METHOD = BaselineMethod(LUNAR, "LUNAR",
                        "one layer's MLP output on forget inputs redirected toward refusal activations",
                        order=54)
