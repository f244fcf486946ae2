"""RT, rejection tuning (RWKU's baseline; TOFU's "idk" fine-tuning): fine-tune on refusals to the forget questions.

loss = (forget_weight * Σ NLL(alternate tokens) + alpha * Σ NLL(retain tokens)) / (alternate + retain tokens): one
token mean over the refusal and retain answers together, as locuslab/tofu's `idk` loss concatenates the two
batches and takes one `model(...).loss` (dataloader.py, CustomTrainerForgetting, loss_type "idk"; weights 1 and
1 there), so a short refusal weighs by its tokens, not as half the loss. The alternate of a forget row is its
own `alternate` answer (RWKU reject.json: `instruction` -> `output`, a refusal) or a refusal drawn from TOFU's
`idontknow` list every epoch. Without a retain term (alpha 0) it is the refusals' token-mean NLL.
Sources: RWKU LLaMA-Factory/src/llmtuner/train/rt/workflow.py (supervised fine-tuning, stage "sft", on the
target's Reject corpus) and scripts/full/run_rt.sh (lr 4e-7, batch 8, 3 epochs, cosine, 20 warm-up steps, no
retain term); on TOFU, locuslab/tofu's `idk` loss with the protocol's TOFU schedule.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from .base import RetainConfig, UnlearningMethod
from .losses import sequence_logprobs
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class RTConfig(RetainConfig):
    """The trainer's fields and the retain term's."""


@register_method
class RT(UnlearningMethod):
    name = "rt"
    Config = RTConfig
    needs_retain = True
    needs_alternate = True

    def compute_loss(self, model, batch, ref_model=None):
        if "alternate" not in batch:
            raise InputError("rt: the batch has no 'alternate' (refusal) examples")
        parts = [("refusal_nll", batch["alternate"], self.config.forget_weight)]
        if self.uses_retain:
            parts.append(("retain_nll", self._retain_batch(batch), self.config.alpha))
        logs: dict[str, float] = {}
        summed, tokens = 0.0, 0
        for name, inputs, weight in parts:
            logp, n_tokens = sequence_logprobs(model, inputs)
            logs[name] = float((-logp.sum() / n_tokens.sum()).detach())
            summed = summed + weight * -logp.sum()
            # the accumulation group's tokens of each side (the trainer's totals), or this batch's
            group = inputs.get("group_tokens")
            tokens = tokens + (n_tokens.sum() if group is None else group.to(logp.device))
        loss = summed / tokens
        logs["loss"] = float(loss.detach())
        return loss, logs


#: The runner's view of it (entry point `cru_harness.methods`: RT).
METHOD = BaselineMethod(RT, "RT",
                        "rejection tuning: NLL of refusals to the forget questions",
                        needs_qa_rows=True, order=52,
                        alternate="refusals (a forget row's own, as RWKU's reject corpus gives; else a benchmark's, "
                                  "TOFU's IdkDPO list)")
