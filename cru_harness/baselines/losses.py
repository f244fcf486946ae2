"""Shared loss pieces: per-sequence answer log-likelihoods and batch reductions.

Labels follow the Hugging Face convention (aligned with `input_ids`, -100 = ignored): position t's logits
predict label t+1. All sums are in float32 whatever the autocast dtype.

Reductions are exact under gradient accumulation: the trainer writes into each sub-batch the totals of
the whole accumulation group (`group_tokens`, `group_seqs`, over every process's micro-batches), and each term is
"sum over this micro-batch / group total". Called on a single batch without those keys (tests, direct use),
the totals are the batch's own, i.e. the usual token mean (`model(...).loss`) and sequence mean. A method
normalising by another count adds it in `UnlearningMethod.group_counts`; `group_mean` divides by it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..training.objective import default_counts  # noqa: F401  (the engine's counts; losses divide by them)
from .data import IGNORE_INDEX


def sequence_logprobs(model, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of answer-token log-probs per sequence [B], number of answer tokens per sequence [B])."""
    logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    labels = inputs["labels"][:, 1:].to(logits.device)
    logits = logits[:, :-1, :].float()
    nll = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="none")
    mask = labels != IGNORE_INDEX
    n_tokens = mask.sum(-1)
    if bool((n_tokens == 0).any()):
        raise ValueError("a sequence has no answer tokens to score (check prompt masking / max_length)")
    return -(nll * mask).sum(-1), n_tokens


def group_mean(values_sum: torch.Tensor, local_count, inputs: dict, name: str) -> torch.Tensor:
    """`values_sum` / (the accumulation group's count `name`, default: `local_count`, this batch's)."""
    total = inputs.get(f"group_{name}")
    return values_sum / (local_count if total is None else total.to(values_sum.device))


def token_mean(values_sum: torch.Tensor, n_tokens: torch.Tensor, inputs: dict) -> torch.Tensor:
    """Σ per-sequence token sums / (tokens in the accumulation group, default: in this batch)."""
    total = inputs.get("group_tokens")
    # The totals live on the accelerator's device; under a device_map the logits may end on another GPU.
    return values_sum.sum() / (n_tokens.sum() if total is None else total.to(values_sum.device))


def sequence_mean(values: torch.Tensor, inputs: dict) -> torch.Tensor:
    """Σ per-sequence values / (sequences in the accumulation group, default: in this batch)."""
    total = inputs.get("group_seqs")
    return values.sum() / (values.shape[0] if total is None else total.to(values.device))


def nll_loss(model, inputs: dict) -> tuple[torch.Tensor, float]:
    """Token-mean NLL of the answers (the training term) and its plain batch value (for logs)."""
    logp, n_tokens = sequence_logprobs(model, inputs)
    term = token_mean(-logp, n_tokens, inputs)
    return term, float((-logp.sum() / n_tokens.sum()).detach())


@torch.no_grad()
def reference_logprobs(ref_model, inputs: dict) -> torch.Tensor:
    if ref_model is None:
        raise ValueError("this method needs a reference model (a frozen copy of the starting model)")
    logp, _ = sequence_logprobs(ref_model, inputs)
    return logp.detach()  # on the reference's output device: callers move it next to the policy's log-probs


def _logits(model, inputs: dict) -> torch.Tensor:
    return model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits


def kl_to_reference(model, ref_model, inputs: dict) -> tuple[torch.Tensor, float]:
    """KL(reference || model) of the next-token distributions, summed over the vocabulary, mean over the positions
    of the rows' real tokens (prompt and answer; `positions`), as open-unlearning's `compute_kl_divergence`
    (kl_div(log model, log ref, reduction="batchmean", log_target=True) over the flattened positions) on the retain
    rows. That one averages over every position of the padded batch; here padding is left out (equal on a batch
    without padding), so the term does not depend on how rows are padded into micro-batches."""
    if ref_model is None:
        raise ValueError("a KL retain term needs a reference model (a frozen copy of the starting model)")
    log_q = F.log_softmax(_logits(model, inputs).float(), dim=-1)
    with torch.no_grad():
        log_p = F.log_softmax(_logits(ref_model, inputs).float(), dim=-1).to(log_q.device)
    per_position = (log_p.exp() * (log_p - log_q)).sum(-1)
    mask = inputs["attention_mask"].to(log_q.device).bool()
    kl_sum = per_position.masked_fill(~mask, 0.0).sum()
    return group_mean(kl_sum, mask.sum(), inputs, "positions"), float((kl_sum / mask.sum()).detach())


def token_losses(model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-position cross-entropy of the shifted labels [B, T-1] (0 where masked), the answer mask [B, T-1],
    the shifted float32 logits [B, T-1, V])."""
    logits = _logits(model, inputs)[:, :-1].float()
    labels = inputs["labels"][:, 1:].to(logits.device)
    ce = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="none")
    mask = labels != IGNORE_INDEX
    if not bool(mask.any()):
        raise ValueError("the batch has no answer tokens to score (check prompt masking / max_length)")
    return ce, mask, logits


def weighted_ascent_term(model, inputs: dict, weight) -> tuple[torch.Tensor, float]:
    """-token mean of w(p) * NLL over the answer tokens, w computed from p = exp(-NLL) and detached (no gradient
    through the weight), as open-unlearning's `compute_wga_loss` / `compute_satimp_loss`."""
    ce, mask, _ = token_losses(model, inputs)
    w = weight(torch.exp(-ce.detach()))
    weighted = (w * ce).masked_fill(~mask, 0.0).sum()
    term = -group_mean(weighted, mask.sum(), inputs, "tokens")
    return term, float((-weighted / mask.sum()).detach())
