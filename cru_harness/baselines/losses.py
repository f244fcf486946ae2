"""Shared loss pieces: per-sequence answer log-likelihoods and batch reductions.

Labels follow the Hugging Face convention (aligned with `input_ids`, -100 = ignored): position t's logits
predict label t+1. All sums are in float32 whatever the autocast dtype.

Reductions are exact under gradient accumulation: the trainer writes into each sub-batch the totals of
the whole accumulation group (`group_tokens`, `group_seqs`, over every process's micro-batches), and each term is
"sum over this micro-batch / group total". Called on a single batch without those keys (tests, direct use),
the totals are the batch's own, i.e. the usual token mean (`model(...).loss`) and sequence mean.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

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
