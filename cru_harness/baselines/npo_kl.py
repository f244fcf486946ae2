"""NPO-KL: NPO with a KL retain term (open-unlearning's NPO with `retain_loss_type: KL`; MUSE's NPO_KLR).

loss = forget_weight * NPO forget term (see `npo.py`) + alpha * KL(ref || model)(retain), the KL as
`losses.kl_to_reference` (open-unlearning src/trainer/utils.py `compute_kl_divergence`); one frozen reference
serves both terms. Defaults: open-unlearning configs/trainer/NPO.yaml (beta 0.1, alpha 1.0, gamma = our
forget_weight 1.0) with the protocol's TOFU schedule. On RWKU, NPO's preset (scripts/full/run_npo.sh) trains on
the forget corpus only (alpha 0), where no retain term is left to differ: NPO-KL's RWKU preset keeps NPO's
schedule with open-unlearning's alpha 1.0, so the KL term is in use (retain rows needed).
"""
from __future__ import annotations

from dataclasses import dataclass

from .npo import NPO, NPOConfig
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class NPOKLConfig(NPOConfig):
    """NPO's fields; the retain term is a KL to the reference."""


@register_method
class NPOKL(NPO):
    name = "npo_kl"
    Config = NPOKLConfig
    retain_loss = "kl"


#: The runner's view of it (entry point `cru_harness.methods`: NPO-KL).
METHOD = BaselineMethod(NPOKL, "NPO-KL",
                        "NPO with a KL retain term to the frozen model",
                        order=31)
