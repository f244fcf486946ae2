"""SatImp (Yang et al. 2025, "Exploring Criteria of Loss Reweighting to Enhance LLM Unlearning"): gradient ascent
on the answer tokens weighted by saturation p^beta1 and importance (1-p)^beta2, with open-unlearning's retain term.

forget term = -mean_{answer tokens t} p_t^beta1 (1 - p_t)^beta2 * NLL_t, p_t = exp(-NLL_t) detached
loss = forget_weight * forget term + alpha * NLL(retain)
Source: open-unlearning src/trainer/utils.py `compute_satimp_loss` and src/trainer/unlearn/satimp.py; defaults
configs/trainer/SatImp.yaml (beta1 5.0, beta2 1.0, alpha 1.0, gamma = our forget_weight 0.1, lr 1e-5, 5 epochs;
the yaml's values, which Hydra passes over the class's own alpha 0.1 / gamma 1.0), the protocol's TOFU schedule
otherwise. RWKU ships no SatImp script: there the base RWKU schedule with these values.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..hparams import bound_problem
from .base import RetainConfig, UnlearningMethod
from .losses import weighted_ascent_term
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class SatImpConfig(RetainConfig):
    beta1: float = 5.0
    beta2: float = 1.0
    forget_weight: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        for name in ("beta1", "beta2"):   # exponents of probabilities in [0, 1]: negative ones blow up at 0
            if problem := bound_problem(getattr(self, name), low=0):
                raise InputError(f"{name}: {problem}")


@register_method
class SatImp(UnlearningMethod):
    name = "satimp"
    Config = SatImpConfig
    needs_retain = True

    def compute_loss(self, model, batch, ref_model=None):
        logs: dict[str, float] = {}
        b1, b2 = self.config.beta1, self.config.beta2
        term, logs["satimp_forget"] = weighted_ascent_term(model, batch["forget"],
                                                           lambda p: p ** b1 * (1 - p) ** b2)
        loss = self.config.forget_weight * term + self._retain_term(model, batch, logs, ref_model)
        logs["loss"] = float(loss.detach())
        return loss, logs


#: The runner's view of it (entry point `cru_harness.methods`: SatImp).
METHOD = BaselineMethod(SatImp, "SatImp",
                        "gradient ascent weighted by token saturation and importance, + NLL(retain)",
                        order=56)
