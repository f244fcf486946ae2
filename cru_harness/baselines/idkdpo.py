"""IdkDPO: DPO preferring a refusal over the true answer (TOFU's `idontknow` list), + retain term.

forget term = -s * mean_i log sigmoid(beta * ((log pi(w_i) - log ref(w_i)) - (log pi(l_i) - log ref(l_i))))
with w = the refusal (batch["alternate"]), l = the true answer (batch["forget"]), same prompt, sequence
log-probs; s = `loss_scale`: 2/beta by default, open-unlearning's (`compute_dpo_loss`); RWKU's preset 1, the
sigmoid loss of trl's DPOTrainer that RWKU's LLaMA-Factory runs (no 2/beta factor). The factor matters beyond
AdamW's scale invariance because both clip the gradient norm at 1.0: a loss 20x larger (beta 0.1) is clipped on
steps where RWKU's is not. The refusal per forget item is redrawn every epoch,
deterministically from (seed, epoch) (`data.pick_refusals`), as the references draw one on every fetch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from ..errors import InputError
from ..hparams import bound_problem
from .base import RetainConfig, UnlearningMethod
from .losses import reference_logprobs, sequence_logprobs, sequence_mean
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class IdkDPOConfig(RetainConfig):
    beta: float = 0.1
    loss_scale: float | None = None    # the forget term's factor; None: 2/beta (open-unlearning)

    def __post_init__(self):
        super().__post_init__()
        if self.loss_scale is not None and (problem := bound_problem(self.loss_scale, above=0)):
            raise InputError(f"loss_scale: {problem}")


def dpo_forget_term(model, ref_model, chosen, rejected, beta: float, scale: float | None = None):
    logp_w, _ = sequence_logprobs(model, chosen)
    logp_l, _ = sequence_logprobs(model, rejected)
    ratio_w = logp_w - reference_logprobs(ref_model, chosen).to(logp_w.device)
    ratio_l = logp_l - reference_logprobs(ref_model, rejected).to(logp_l.device)
    margin = ratio_w - ratio_l
    per_seq = -(2.0 / beta if scale is None else scale) * F.logsigmoid(beta * margin)
    return sequence_mean(per_seq, rejected), float(per_seq.detach().mean()), float(margin.detach().mean())


@register_method
class IdkDPO(UnlearningMethod):
    name = "idkdpo"
    Config = IdkDPOConfig
    needs_ref = True
    needs_retain = True
    needs_alternate = True

    def compute_loss(self, model, batch, ref_model=None):
        if "alternate" not in batch:
            raise InputError("idkdpo: the batch has no 'alternate' (refusal) examples")
        logs: dict[str, float] = {}
        term, logs["dpo_forget"], logs["dpo_margin"] = dpo_forget_term(
            model, ref_model, batch["alternate"], batch["forget"], self.config.beta, self.config.loss_scale)
        loss = self.config.forget_weight * term + self._retain_term(model, batch, logs, ref_model)
        logs["loss"] = float(loss.detach())
        return loss, logs


#: The runner's view of it (entry point `cru_harness.methods`: IdkDPO).
METHOD = BaselineMethod(IdkDPO, "IdkDPO",
                        "DPO with an 'I don't know' refusal as the preferred answer, + NLL(retain)",
                        needs_qa_rows=True, order=50)
