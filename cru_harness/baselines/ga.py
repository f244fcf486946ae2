"""Gradient Ascent: maximise the NLL of the forget answers, loss = -NLL(forget) (token mean)."""
from __future__ import annotations

from dataclasses import dataclass

from .base import BaselineConfig, UnlearningMethod
from .losses import nll_loss
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class GAConfig(BaselineConfig):
    """The trainer's fields (GA has no retain term)."""


@register_method
class GradientAscent(UnlearningMethod):
    name = "ga"
    Config = GAConfig

    def compute_loss(self, model, batch, ref_model=None):
        forget_nll, value = nll_loss(model, batch["forget"])
        loss = -forget_nll
        return loss, {"loss": float(loss.detach()), "forget_nll": value}


#: The runner's view of it (entry point `cru_harness.methods`: GA).
NO_RETAIN_TERM = "GA has no retain term (use GD for -NLL(forget) + NLL(retain))"
METHOD = BaselineMethod(GradientAscent, "GA", "gradient ascent: -NLL(forget)",
                        refusals={"alpha": NO_RETAIN_TERM, "forget_weight": NO_RETAIN_TERM}, order=10,
                        known_as=("GradAscent",))  # open-unlearning's trainer name
