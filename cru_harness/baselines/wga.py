"""WGA, Weighted Gradient Ascent (Wang et al. 2025, "Rethinking LLM Unlearning Objectives: A Gradient Perspective
and Go Beyond"), with open-unlearning's retain term.

forget term = -mean_{answer tokens t} p_t^beta * NLL_t, p_t = exp(-NLL_t) detached (a weight, not a gradient path)
loss = forget_weight * forget term + alpha * NLL(retain)
Source: open-unlearning src/trainer/utils.py `compute_wga_loss` (token mean over the batch's answer tokens) and
src/trainer/unlearn/wga.py; defaults configs/trainer/WGA.yaml (beta 1.0, alpha 1.0, gamma = our forget_weight
1.0, lr 1e-5, 5 epochs), the protocol's TOFU schedule otherwise. RWKU ships no WGA script: there the base RWKU
schedule (3 epochs, cosine, 20 warm-up steps) with these values.
"""
from __future__ import annotations

from dataclasses import dataclass

from .base import RetainConfig, UnlearningMethod
from .losses import weighted_ascent_term
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class WGAConfig(RetainConfig):
    beta: float = 1.0


@register_method
class WGA(UnlearningMethod):
    name = "wga"
    Config = WGAConfig
    needs_retain = True

    def compute_loss(self, model, batch, ref_model=None):
        logs: dict[str, float] = {}
        beta = self.config.beta
        term, logs["wga_forget"] = weighted_ascent_term(model, batch["forget"], lambda p: p ** beta)
        loss = self.config.forget_weight * term + self._retain_term(model, batch, logs, ref_model)
        logs["loss"] = float(loss.detach())
        return loss, logs


#: The runner's view of it (entry point `cru_harness.methods`: WGA).
METHOD = BaselineMethod(WGA, "WGA",
                        "weighted gradient ascent (confidence-weighted tokens), + NLL(retain)",
                        order=57)
