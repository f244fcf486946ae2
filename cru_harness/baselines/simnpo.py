"""SimNPO (Fan et al. 2024): reference-free NPO with length-normalised log-probs.

forget term = -(2/beta) * mean_i log sigmoid(-beta * log pi_theta(y_i|x_i) / |y_i| - gamma)
loss = forget_weight * forget term + alpha * NLL(retain).
Naming: our `gamma` is the paper's margin, placed as the paper writes it; open-unlearning (and the SimNPO
authors' code) write the margin inside the scaling, log sigmoid(beta * (nll/|y| - delta)), so their `delta`
is our `gamma / beta` (equal at the default 0). Our `forget_weight` is open-unlearning's `gamma`.
Defaults: TOFU forget10's (beta 4.5, weight 0.125, gamma 0); forget05's and RWKU's are in those benchmarks' packages
(`Benchmark.method_defaults`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from .base import RetainConfig, UnlearningMethod
from .losses import sequence_logprobs, sequence_mean
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class SimNPOConfig(RetainConfig):
    beta: float = 4.5
    gamma: float = 0.0
    forget_weight: float = 0.125


def simnpo_forget_term(model, inputs, beta: float, gamma: float):
    logp, n_tokens = sequence_logprobs(model, inputs)
    per_seq = -(2.0 / beta) * F.logsigmoid(-beta * logp / n_tokens - gamma)
    return sequence_mean(per_seq, inputs), float(per_seq.detach().mean())


@register_method
class SimNPO(UnlearningMethod):
    name = "simnpo"
    Config = SimNPOConfig
    needs_retain = True

    def compute_loss(self, model, batch, ref_model=None):
        logs: dict[str, float] = {}
        term, logs["simnpo_forget"] = simnpo_forget_term(model, batch["forget"], self.config.beta, self.config.gamma)
        loss = self.config.forget_weight * term + self._retain_term(model, batch, logs, ref_model)
        logs["loss"] = float(loss.detach())
        return loss, logs


#: The runner's view of it (entry point `cru_harness.methods`: SimNPO).
METHOD = BaselineMethod(SimNPO, "SimNPO",
                        "reference-free NPO on length-normalised log-probs, + NLL(retain)",
                        order=40)
