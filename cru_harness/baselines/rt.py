"""RT, rejection tuning (RWKU's baseline; TOFU's "idk" fine-tuning): fine-tune on refusals to the forget questions.

loss = NLL(alternate) + alpha * NLL(retain), token means over the answer tokens: the alternate of a forget row is
its own `alternate` answer (RWKU reject.json: `instruction` -> `output`, a refusal) or a refusal drawn from
TOFU's `idontknow` list every epoch.
Sources: RWKU LLaMA-Factory/src/llmtuner/train/rt/workflow.py (supervised fine-tuning, stage "sft", on the
target's Reject corpus) and scripts/full/run_rt.sh (lr 4e-7, batch 8, 3 epochs, cosine, 20 warm-up steps, no
retain term); on TOFU, locuslab/tofu's `idk` loss (the refusal NLL on forget questions plus the retain NLL,
alpha 1) with the protocol's TOFU schedule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import InputError
from .base import RetainConfig, UnlearningMethod
from .losses import nll_loss
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class RTConfig(RetainConfig):
    _PRESETS: ClassVar = {("rwku", None): dict(learning_rate=4e-7, effective_batch_size=8, alpha=0.0)}


@register_method
class RT(UnlearningMethod):
    name = "rt"
    Config = RTConfig
    needs_retain = True
    needs_alternate = True

    def compute_loss(self, model, batch, ref_model=None):
        if "alternate" not in batch:
            raise InputError("rt: the batch has no 'alternate' (refusal) examples")
        logs: dict[str, float] = {}
        term, logs["refusal_nll"] = nll_loss(model, batch["alternate"])
        loss = self.config.forget_weight * term + self._retain_term(model, batch, logs, ref_model)
        logs["loss"] = float(loss.detach())
        return loss, logs


#: The runner's view of it (entry point `cru_harness.methods`: RT).
METHOD = BaselineMethod(RT, "RT",
                        "rejection tuning: NLL of refusals to the forget questions",
                        order=52)
