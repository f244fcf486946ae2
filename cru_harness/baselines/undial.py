"""UNDIAL (Dong et al., NAACL 2025): self-distillation towards the frozen model's logits with the true next
token's logit lowered by beta.

forget term = mean_{positions t} CE(softmax(z_ref,t - beta * onehot(y_t)), p_theta,t)
over the positions predicting a real token of a forget row (prompt and answer), the one-hot only where y_t is an
answer token (elsewhere the target is the frozen model's own distribution); loss = forget_weight * forget term +
alpha * NLL(retain).
Source: open-unlearning src/trainer/utils.py `compute_undial_loss` and src/trainer/unlearn/undial.py (the teacher
is a frozen copy of the starting model). Two departures, both at positions that are not answer tokens: the
reference averages over every shifted position of the padded batch, padding included (left out here), and writes
its one-hot at label index -100, which wraps to vocabulary entry V-100 and penalises that token at every prompt
and padding position (no penalty here). Defaults: configs/trainer/UNDIAL.yaml (beta 10, alpha 0: the paper uses
no retain set, gamma = our forget_weight 1.0, lr 1e-4, 10 epochs), the protocol's TOFU schedule otherwise. RWKU
ships no UNDIAL script: there the base RWKU schedule with these values.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import RetainConfig, UnlearningMethod
from .data import IGNORE_INDEX
from .losses import default_counts, group_mean
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class UNDIALConfig(RetainConfig):
    beta: float = 10.0
    alpha: float = 0.0
    learning_rate: float = 1e-4
    num_epochs: int = 10


def undial_forget_term(model, ref_model, inputs: dict, beta: float) -> tuple[torch.Tensor, float]:
    if ref_model is None:
        raise ValueError("undial needs a reference model (a frozen copy of the starting model)")
    ids, attention = inputs["input_ids"], inputs["attention_mask"]
    log_p = F.log_softmax(model(input_ids=ids, attention_mask=attention).logits[:, :-1].float(), dim=-1)
    with torch.no_grad():
        teacher = ref_model(input_ids=ids, attention_mask=attention).logits[:, :-1].float().to(log_p.device)
        labels = inputs["labels"][:, 1:].to(log_p.device)
        answer = labels != IGNORE_INDEX
        penalty = F.one_hot(labels.clamp(min=0), teacher.shape[-1]) * answer.unsqueeze(-1)
        target = F.softmax(teacher - beta * penalty, dim=-1)
    per_position = -(target * log_p).sum(-1)
    positions = attention[:, 1:].to(log_p.device).bool()
    summed = per_position.masked_fill(~positions, 0.0).sum()
    return group_mean(summed, positions.sum(), inputs, "predicted"), float((summed / positions.sum()).detach())


@register_method
class UNDIAL(UnlearningMethod):
    name = "undial"
    Config = UNDIALConfig
    needs_ref = True
    needs_retain = True

    def group_counts(self, key, inputs):
        # the positions predicting a real token (the reference's shifted positions, less padding)
        return {**default_counts(inputs), "predicted": inputs["attention_mask"][:, 1:].sum()}

    def compute_loss(self, model, batch, ref_model=None):
        logs: dict[str, float] = {}
        term, logs["undial_forget"] = undial_forget_term(model, ref_model, batch["forget"], self.config.beta)
        loss = self.config.forget_weight * term + self._retain_term(model, batch, logs, ref_model)
        logs["loss"] = float(loss.detach())
        return loss, logs


#: The runner's view of it (entry point `cru_harness.methods`: UNDIAL).
METHOD = BaselineMethod(UNDIAL, "UNDIAL",
                        "self-distillation toward the frozen model's logits, true token's logit lowered",
                        order=55)
