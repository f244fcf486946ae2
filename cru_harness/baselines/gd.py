"""Gradient Difference: loss = forget_weight * (-NLL(forget)) + alpha * NLL(retain)."""
from __future__ import annotations

from dataclasses import dataclass

from .base import RetainConfig, UnlearningMethod
from .losses import nll_loss
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class GDConfig(RetainConfig):
    """GA's fields and the retain term's."""


@register_method
class GradientDifference(UnlearningMethod):
    name = "gd"
    Config = GDConfig
    needs_retain = True

    def compute_loss(self, model, batch, ref_model=None):
        logs: dict[str, float] = {}
        forget_nll, logs["forget_nll"] = nll_loss(model, batch["forget"])
        loss = -self.config.forget_weight * forget_nll + self._retain_term(model, batch, logs, ref_model)
        logs["loss"] = float(loss.detach())
        return loss, logs


#: The runner's view of it (entry point `cru_harness.methods`: GD).
METHOD = BaselineMethod(GradientDifference, "GD",
                        "gradient difference: -NLL(forget) + alpha * NLL(retain)",
                        order=20, known_as=("GradDiff",))  # open-unlearning's trainer name
