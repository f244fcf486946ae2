"""Negative Preference Optimization (Zhang et al. 2024), with open-unlearning's retain term.

forget term = -(2/beta) * mean_i log sigmoid(-beta * (log pi_theta(y_i|x_i) - log pi_ref(y_i|x_i)))
with sequence log-probs (sums over answer tokens); pi_ref is a frozen copy of the starting model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from .base import RetainConfig, UnlearningMethod
from .losses import reference_logprobs, sequence_logprobs, sequence_mean
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class NPOConfig(RetainConfig):
    beta: float = 0.1


def npo_forget_term(model, ref_model, inputs, beta: float):
    logp, _ = sequence_logprobs(model, inputs)
    ref_logp = reference_logprobs(ref_model, inputs).to(logp.device)
    per_seq = -(2.0 / beta) * F.logsigmoid(-beta * (logp - ref_logp))
    return sequence_mean(per_seq, inputs), float(per_seq.detach().mean()), float((logp - ref_logp).detach().mean())


@register_method
class NPO(UnlearningMethod):
    name = "npo"
    Config = NPOConfig
    needs_ref = True
    needs_retain = True

    def compute_loss(self, model, batch, ref_model=None):
        logs: dict[str, float] = {}
        term, logs["npo_forget"], logs["forget_logratio"] = npo_forget_term(model, ref_model, batch["forget"],
                                                                            self.config.beta)
        loss = self.config.forget_weight * term + self._retain_term(model, batch, logs, ref_model)
        logs["loss"] = float(loss.detach())
        return loss, logs


#: The runner's view of it (entry point `cru_harness.methods`: NPO).
METHOD = BaselineMethod(NPO, "NPO",
                        "negative preference optimization against a frozen reference, + NLL(retain)",
                        order=30)
