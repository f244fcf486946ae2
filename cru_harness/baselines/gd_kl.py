"""GD-KL: Gradient Difference with a KL retain term (open-unlearning's GradDiff with `retain_loss_type: KL`; MUSE's
GA_KLR).

loss = forget_weight * (-NLL(forget)) + alpha * KL(ref || model)(retain), the KL as `losses.kl_to_reference`
(open-unlearning src/trainer/utils.py `compute_kl_divergence`), against a frozen copy of the starting model.
Defaults: open-unlearning configs/trainer/GradDiff.yaml (gamma = our forget_weight 1.0, alpha 1.0) with the
protocol's TOFU schedule; on RWKU, GD's (RWKU ships no GD script: GA's scripts/full/run_ga.sh schedule).
"""
from __future__ import annotations

from dataclasses import dataclass

from .gd import GDConfig, GradientDifference
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class GDKLConfig(GDConfig):
    """GD's fields and presets; only the retain term differs."""


@register_method
class GradientDifferenceKL(GradientDifference):
    name = "gd_kl"
    Config = GDKLConfig
    needs_ref = True
    retain_loss = "kl"


#: The runner's view of it (entry point `cru_harness.methods`: GD-KL).
METHOD = BaselineMethod(GradientDifferenceKL, "GD-KL",
                        "gradient difference with a KL retain term to the frozen model",
                        order=21)
