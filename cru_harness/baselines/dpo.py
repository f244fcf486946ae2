"""DPO (open-unlearning's DPO trainer; RWKU's DPO baseline): prefer an alternate answer over the forget answer.

forget term = -(2/beta) * mean_i log sigmoid(beta * ((log pi(w_i) - log ref(w_i)) - (log pi(l_i) - log ref(l_i))))
as `idkdpo.dpo_forget_term`, l = the forget answer, w = the row's own `alternate` answer (RWKU pair.json: the
preferred response, response[0], against the true one) or, for a row without one, a refusal drawn from TOFU's
`idontknow` list every epoch, which makes it IdkDPO (the TOFU setting: "IdkDPO's refusals as the positive").
loss = forget_weight * forget term + alpha * NLL(retain).
Sources: open-unlearning src/trainer/unlearn/dpo.py and utils.py `compute_dpo_loss`, configs/trainer/DPO.yaml
(beta 0.1, alpha 1.0, gamma = our forget_weight 1.0), the protocol's TOFU schedule; RWKU
LLaMA-Factory/scripts/full/run_dpo.sh (lr 5e-6, batch 2 x 4 = 8, 3 epochs, cosine, 20 warm-up steps, dpo_beta
0.1, dpo_ftx 0: no retain term), whose sigmoid DPO loss (trl's) has no 2/beta factor: RWKU's preset sets
`loss_scale` 1 (the factor matters because the gradient norm is clipped at 1.0; `idkdpo`).
"""
from __future__ import annotations

from dataclasses import dataclass

from .idkdpo import IdkDPO, IdkDPOConfig
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class DPOConfig(IdkDPOConfig):
    """IdkDPO's fields and presets (open-unlearning's DPO.yaml and RWKU's run_dpo.sh give the same values)."""


@register_method
class DPO(IdkDPO):
    name = "dpo"
    Config = DPOConfig


#: The runner's view of it (entry point `cru_harness.methods`: DPO).
METHOD = BaselineMethod(DPO, "DPO",
                        "DPO: an alternate answer preferred over the forget answer, + NLL(retain)",
                        needs_qa_rows=True, order=51,
                        alternate="alternate answers (a forget row's own, as RWKU's pair corpus gives; else a "
                                  "benchmark's refusals, TOFU's IdkDPO list)")
