"""Membership-inference scores (RWKU's MIA: LOSS, Zlib, Min-K%, Min-K%++) and the AUC between two sets.

Reference: jinzhuoran/RWKU ``LLaMA-Factory/src/llmtuner/eval/eval_mia.py`` (itself after the Min-K%++ authors'
code). **Sign convention (RWKU's): every score is larger for text the model has seen** - they are built from
log-*likelihoods*, not losses. Inputs are per-token log-probs of a raw text (no template) under the model,
one per predicted token (RWKU: ``log_softmax(logits[:-1])`` gathered at ``input_ids[1:]``, i.e. every token
after the first).
"""
from __future__ import annotations

import zlib
from typing import Any

import numpy as np
from scipy import stats

from ._checks import as_1d, as_float, check_text

__all__ = [
    "MIN_K_RATIO",
    "MIN_SIGMA",
    "loss_score",
    "zlib_score",
    "min_k",
    "min_k_plus_plus",
    "mia_auc",
]

#: k reported by the protocol (RWKU reports Min-K%++ at ratio 0.2).
MIN_K_RATIO = 0.2
#: Floor on the standard deviation in Min-K%++ (open-unlearning clamps the variance at 1e-6, i.e. std 1e-3).
MIN_SIGMA = 1e-3


def _logprobs(token_logprobs: Any) -> np.ndarray:
    lp = as_1d(token_logprobs, "token_logprobs")
    if (lp > 0).any():
        raise ValueError("token_logprobs: a log-probability cannot be positive")
    return lp


def _check_k(k: float) -> float:
    k = as_float(k, "k")
    if not 0.0 < k <= 1.0:
        raise ValueError(f"k must be in (0, 1], got {k}")
    return k


def _lowest_k_mean(values: np.ndarray, k: float) -> float:
    # RWKU: k_length = int(len * ratio); np.mean(np.sort(x)[:k_length]). For texts shorter than 1/k tokens that
    # is an empty slice and RWKU's value is NaN; here at least one token is kept (open-unlearning's
    # max(1, int(len * k))). Identical whenever len * k >= 1.
    n_keep = max(1, int(len(values) * k))
    return float(np.mean(np.sort(values)[:n_keep]))


def loss_score(token_logprobs: Any) -> float:
    """RWKU's LOSS score: the mean token log-likelihood (``-model(...).loss``). Larger = more member-like."""
    return float(np.mean(_logprobs(token_logprobs)))


def zlib_score(text: str, avg_loglik: float) -> float:
    """RWKU's Zlib score: ``avg_loglik / len(zlib.compress(text.encode("utf-8")))``.

    ``avg_loglik`` is :func:`loss_score` of ``text`` (a mean log-likelihood, <= 0); the denominator is the
    zlib-compressed byte length at zlib's default level, as in RWKU. Larger (closer to 0) = more member-like.
    """
    check_text(text, "text")
    ll = as_float(avg_loglik, "avg_loglik")
    if ll > 0:
        raise ValueError(f"avg_loglik is a mean log-likelihood and cannot be positive, got {ll}")
    return ll / len(zlib.compress(text.encode("utf-8")))


def min_k(token_logprobs: Any, k: float = MIN_K_RATIO) -> float:
    """Min-K%: the mean of the lowest ``int(n * k)`` token log-probs (at least one). Larger = more member-like."""
    return _lowest_k_mean(_logprobs(token_logprobs), _check_k(k))


def min_k_plus_plus(token_logprobs: Any, mu: Any, sigma: Any, k: float = MIN_K_RATIO) -> float:
    """Min-K%++: Min-K% over the normalised scores ``(log p(x_t) - mu_t) / sigma_t``.

    ``mu_t`` and ``sigma_t`` are the mean and the **standard deviation** of ``log p(z)`` for ``z`` drawn from
    the model's own next-token distribution at position t (``mu = sum_z p(z) log p(z)``;
    ``sigma = sqrt(sum_z p(z) log p(z)^2 - mu^2)``). RWKU's code names the *variance* ``sigma`` and divides by
    ``sigma.sqrt()``: the same number. ``sigma`` below :data:`MIN_SIGMA` is raised to it (open-unlearning's
    clamp; RWKU would divide by zero on a one-hot distribution). Larger = more member-like.
    """
    lp = _logprobs(token_logprobs)
    mu_a = as_1d(mu, "mu")
    sigma_a = as_1d(sigma, "sigma")
    if not len(lp) == len(mu_a) == len(sigma_a):
        raise ValueError(
            f"length mismatch: token_logprobs {len(lp)}, mu {len(mu_a)}, sigma {len(sigma_a)}")
    if (sigma_a < 0).any():
        raise ValueError("sigma is a standard deviation and cannot be negative")
    if (mu_a > 0).any():
        raise ValueError("mu is an expected log-probability and cannot be positive")
    z = (lp - mu_a) / np.maximum(sigma_a, MIN_SIGMA)
    return _lowest_k_mean(z, _check_k(k))


def mia_auc(member_scores: Any, nonmember_scores: Any) -> float:
    """Area under the ROC curve of a score separating members from non-members.

    ``AUC = P(s_member > s_nonmember) + 0.5 * P(s_member == s_nonmember)`` over all pairs (the Mann-Whitney U
    statistic of the members divided by ``n_member * n_nonmember``; ties count one half, as in
    ``sklearn.metrics.roc_auc_score``). Direction: scores follow RWKU's convention (larger = more member-like),
    so 1.0 = every member scores above every non-member, **0.5 = chance** (what a perfect unlearning of the
    forget set against held-out text should reach), below 0.5 = reversed. For RWKU pass the forget-set (FM)
    scores as members and the retain-set (RM) scores as non-members.
    """
    m = as_1d(member_scores, "member_scores")
    n = as_1d(nonmember_scores, "nonmember_scores")
    ranks = stats.rankdata(np.concatenate([m, n]))  # average ranks for ties
    u_member = ranks[: len(m)].sum() - len(m) * (len(m) + 1) / 2.0
    return float(u_member / (len(m) * len(n)))
