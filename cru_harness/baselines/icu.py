"""ICU (in-context unlearning, RWKU's baseline): no training. Every prompt is prefixed with RWKU's instruction
to behave as if the target were unknown (`cru_harness.data.rwku.ICU_INSTRUCTION`); the method is scored by
running the ICU variants of the RWKU tasks on the unmodified model. It is registered so that method lists and
configs can name it; `unlearn()` refuses it with that explanation."""
from __future__ import annotations

from dataclasses import dataclass

from .base import BaselineConfig, UnlearningMethod
from .registry import register_method


@dataclass
class ICUConfig(BaselineConfig):
    """No hyperparameters are used; the class exists so `preset()` works uniformly."""


@register_method
class ICU(UnlearningMethod):
    name = "icu"
    Config = ICUConfig
    trains = False
    # How the runner scores it: the original model, with the ICU variants of the RWKU tasks.
    task_variant = "icu"

    def compute_loss(self, model, batch, ref_model=None):
        raise RuntimeError("icu trains nothing: it is scored by the ICU task variants on the original model")
