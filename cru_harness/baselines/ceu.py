"""CE-U, Cross-Entropy Unlearning (Yang et al. 2025, arXiv:2503.01224).

forget term = mean_t CE(q_t, p_theta,t), q_t = softmax of the model's own logits (detached) with the true answer
token's logit set to -inf: every answer token of a forget row except the first `ignore_first_n_answer_tokens`
(the paper's footnote; open-unlearning's default 1). No retain term, no reference model.
Source: open-unlearning src/trainer/unlearn/ceu.py (`cross_entropy_unlearning_loss`, `compute_batch_ceu`);
defaults configs/trainer/CEU.yaml (ignore_first_n_answer_tokens 1) and community/methods/CEU/run.sh (lr 1e-5,
batch 16 x 2 = 32), the protocol's TOFU schedule otherwise. RWKU ships no CE-U script: there the base RWKU
schedule. On a text row (no prompt) the first label is the first token, which no position predicts: nothing is
dropped there, as in the reference.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import InputError
from ..hparams import bound_problem
from .base import BaselineConfig, UnlearningMethod
from .data import IGNORE_INDEX
from .losses import default_counts, group_mean
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class CEUConfig(BaselineConfig):
    ignore_first_n_answer_tokens: int = 1

    def __post_init__(self):
        super().__post_init__()
        if problem := bound_problem(self.ignore_first_n_answer_tokens, low=0, integer=True):
            raise InputError(f"ignore_first_n_answer_tokens: {problem}")


def ceu_scored(labels: torch.Tensor, n: int) -> torch.Tensor:
    """[B, T-1] mask of the shifted positions CE-U scores: the answer labels less each row's first n."""
    valid = labels != IGNORE_INDEX
    first_n = (valid.cumsum(-1) <= n) & valid
    return (valid & ~first_n)[:, 1:]


def ceu_forget_term(model, inputs: dict, n: int) -> tuple[torch.Tensor, float]:
    logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits[:, :-1].float()
    labels = inputs["labels"][:, 1:].to(logits.device)
    scored = ceu_scored(inputs["labels"], n).to(logits.device)
    if not bool(scored.any()) and inputs.get("group_ceu_tokens") is None:
        raise ValueError(f"ce-u: no answer token is left to score after the first {n} of each row")
    with torch.no_grad():
        suppressed = logits.scatter(-1, labels.clamp(min=0).unsqueeze(-1), float("-inf"))
        target = F.softmax(suppressed, dim=-1)
    per_position = -(target * F.log_softmax(logits, dim=-1)).sum(-1)
    summed = per_position.masked_fill(~scored, 0.0).sum()
    value = float((summed / scored.sum()).detach()) if bool(scored.any()) else 0.0
    return group_mean(summed, scored.sum(), inputs, "ceu_tokens"), value


@register_method
class CEU(UnlearningMethod):
    name = "ceu"
    Config = CEUConfig

    def group_counts(self, key, inputs):
        n = self.config.ignore_first_n_answer_tokens
        return {**default_counts(inputs), "ceu_tokens": ceu_scored(inputs["labels"], n).sum()}

    def compute_loss(self, model, batch, ref_model=None):
        loss, value = ceu_forget_term(model, batch["forget"], self.config.ignore_first_n_answer_tokens)
        return loss, {"loss": float(loss.detach()), "ceu_forget": value}


#: The runner's view of it (entry point `cru_harness.methods`: CE-U).
METHOD = BaselineMethod(CEU, "CE-U",
                        "cross-entropy unlearning: the true token's logit masked out of the target",
                        order=58, known_as=("CEU",))  # open-unlearning's trainer name
