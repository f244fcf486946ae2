"""Privacy and memorization metrics as open-unlearning scores them on TOFU (and MUSE): MIA attacks, the AUC of
forget vs holdout, privleak, extraction strength, exact memorization.

Reference: locuslab/open-unlearning (commit read: d3d7cf9e6b3c) ``src/evals/metrics/mia/`` (``loss.py``,
``zlib.py``, ``min_k.py``, ``min_k_plus_plus.py``, ``gradnorm.py``, ``reference.py``, ``utils.py:mia_auc``),
``src/evals/metrics/privacy.py`` (``privleak``), ``src/evals/metrics/memorization.py`` (``exact_memorization``,
``extraction_strength``), with the defaults of ``configs/eval/tofu_metrics/*.yaml`` (Min-K% and Min-K%++
``k: 0.4``, GradNorm ``p: 2``, privleak ``ref_value: 0.5``).

**Sign convention (open-unlearning's, the opposite of** :mod:`cru_harness.metrics.mia` **):** every attack score
is loss-like - larger = *less* likely a member - and :func:`forget_holdout_auc` labels the forget set 0 and the
holdout set 1, so the AUC is 1 when the model finds the forget set much more likely than the holdout set and 0.5
when it cannot tell them apart (a model that never saw the forget set). The scores here are the negatives of
:mod:`~cru_harness.metrics.mia`'s RWKU-signed ones and reuse them; the AUC is the same number either way.

Which tokens (as open-unlearning's ``evaluate_probability`` / ``tokenwise_logprobs`` pick them):

- LOSS, ZLib and the reference attack use the **average loss over every scored token, EOS included**
  (``evaluate_probability``: labels end with EOS) - pass all of a ``LoglikelihoodResult``'s ``token_logprobs``.
- Min-K%, Min-K%++, GradNorm, exact memorization and extraction strength use ``tokenwise_logprobs`` /
  ``tokenwise_vocab_logprobs``, which **leave out the last scored token** (the EOS prediction, ``[:-1]`` on the
  label positions) - pass the token values without the last one (:func:`without_eos`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ._checks import as_1d, as_float
from .mia import loss_score, mia_auc, min_k, min_k_plus_plus, zlib_score

__all__ = [
    "OPEN_UNLEARNING_MIN_K",
    "GRADNORM_P",
    "PRIVLEAK_DEFAULT_RETAIN_AUC",
    "without_eos",
    "loss_attack",
    "zlib_attack",
    "min_k_attack",
    "min_k_plus_plus_attack",
    "reference_attack",
    "gradnorm_attack",
    "forget_holdout_auc",
    "privleak",
    "exact_memorization",
    "extraction_strength",
]

#: open-unlearning's ``k`` for Min-K% and Min-K%++ on TOFU and MUSE (``configs/eval/*_metrics/mia_min_k*.yaml``).
OPEN_UNLEARNING_MIN_K = 0.4
#: GradNorm's norm (``configs/eval/tofu_metrics/mia_gradnorm.yaml`` ``p: 2``; 1 and inf are also accepted there).
GRADNORM_P = 2
#: The retain model's AUC open-unlearning's privleak assumes when no retain-model log is given
#: (``configs/eval/tofu_metrics/privleak.yaml`` ``ref_value: 0.5``, with a warning).
PRIVLEAK_DEFAULT_RETAIN_AUC = 0.5
_PRIVLEAK_EPSILON = 1e-10   # privacy.py privleak: (score - ref) / (ref + 1e-10) * 100


def without_eos(token_values: Any) -> np.ndarray:
    """The per-token values open-unlearning's ``tokenwise_logprobs`` keeps: all but the last scored token (its
    labels end with EOS, and ``actual_indices[:-1]`` drops that prediction)."""
    arr = np.asarray(token_values)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"token values: expected a non-empty 1-D sequence, got shape {arr.shape}")
    return arr[:-1]


def loss_attack(token_logprobs: Any) -> float:
    """LOSS (``mia/loss.py``): the average loss ``-mean(log p)`` over every scored token, EOS included.
    Larger = less member-like."""
    return -loss_score(token_logprobs)


def zlib_attack(token_logprobs: Any, text: str) -> float:
    """ZLib (``mia/zlib.py``): ``avg_loss / len(zlib.compress(text.encode("utf-8")))``.

    ``token_logprobs``: every scored token, EOS included (``evaluate_probability``); ``text``: the scored tokens
    decoded with ``skip_special_tokens=True`` (``extract_target_texts_from_processed_data``). Larger = less
    member-like."""
    return -zlib_score(text, loss_score(token_logprobs))


def min_k_attack(token_logprobs: Any, k: float = OPEN_UNLEARNING_MIN_K) -> float:
    """Min-K% (``mia/min_k.py``): ``-mean`` of the lowest ``max(1, int(n * k))`` token log-probs, over the tokens
    ``tokenwise_logprobs`` keeps (:func:`without_eos`); 0 for no tokens, as there. Larger = less member-like."""
    lp = np.asarray(token_logprobs, dtype=float)
    if lp.size == 0:
        return 0.0
    return -min_k(lp, k)


def min_k_plus_plus_attack(token_logprobs: Any, mu: Any, sigma: Any, k: float = OPEN_UNLEARNING_MIN_K) -> float:
    """Min-K%++ (``mia/min_k_plus_plus.py``): ``-mean`` of the lowest ``max(1, int(n * k))`` of
    ``(log p(x_t) - mu_t) / sqrt(max(var_t, 1e-6))``, over the tokens ``tokenwise_logprobs`` keeps
    (:func:`without_eos`); 0 for no tokens. ``mu``/``sigma``: the mean and **standard deviation** of ``log p(v)``
    under the model's next-token distribution (``LoglikelihoodResult.token_mu`` / ``token_sigma``); the variance
    floor 1e-6 is the standard-deviation floor 1e-3 of :func:`~cru_harness.metrics.mia.min_k_plus_plus`.
    open-unlearning takes the variance as ``E[log p^2] - mu^2`` in the model's dtype, the `cru` model around
    ``mu`` in float32: the same number up to rounding. Larger = less member-like."""
    lp = np.asarray(token_logprobs, dtype=float)
    if lp.size == 0:
        return 0.0
    return -min_k_plus_plus(lp, mu, sigma, k)


def reference_attack(token_logprobs: Any, reference_token_logprobs: Any) -> float:
    """Reference attack (``mia/reference.py``): the model's average loss minus a reference model's on the same
    scored tokens (EOS included). Larger = less member-like (relative to the reference)."""
    return loss_attack(token_logprobs) - loss_attack(reference_token_logprobs)


def gradnorm_attack(parameter_grad_norms: Any) -> float:
    """GradNorm (``mia/gradnorm.py``): the mean over the model's parameters (each tensor that receives a gradient)
    of ``||d loss / d theta||_p`` for one text, with ``loss = -mean`` of :func:`without_eos`'s log-probs. Pass
    the per-parameter norms (``cru_harness.scoring.model_scores.gradnorm_scores`` computes them from a model). Larger
    = less member-like."""
    norms = as_1d(parameter_grad_norms, "parameter_grad_norms")
    if (norms < 0).any():
        raise ValueError("parameter_grad_norms: a norm cannot be negative")
    return float(np.mean(norms))


def forget_holdout_auc(forget_scores: Any, holdout_scores: Any) -> float:
    """open-unlearning's MIA AUC (``mia/utils.py:mia_auc``): ``roc_auc_score`` with the forget set labelled 0 and
    the holdout set 1, on loss-like scores - 1.0 = every forget item scores below (is more likely than) every
    holdout item, **0.5 = chance** (a model that never saw the forget set), ties count one half.
    Equal to :func:`~cru_harness.metrics.mia.mia_auc` with the holdout scores in the "member" place."""
    return mia_auc(holdout_scores, forget_scores)


def privleak(auc_unlearned: float, auc_retain: float = PRIVLEAK_DEFAULT_RETAIN_AUC) -> float:
    """MUSE's privleak as open-unlearning computes it (``privacy.py:privleak``), in percent:
    ``((1 - auc) - (1 - auc_retain)) / ((1 - auc_retain) + 1e-10) * 100``, each AUC from
    :func:`forget_holdout_auc` (open-unlearning's default: Min-K% at k = 0.4) - ``auc`` of the model evaluated,
    ``auc_retain`` of the retain model (trained without the forget set). **0 = the retain model's leakage (best)**;
    negative = the forget set is still recognisable (under-unlearning, -100 at AUC 1 against a retain AUC of
    0.5); positive = the forget set is less likely than held-out text (over-unlearning). open-unlearning falls
    back to ``auc_retain = 0.5`` (:data:`PRIVLEAK_DEFAULT_RETAIN_AUC`) without a retain-model log."""
    auc = _auc(auc_unlearned, "auc_unlearned")
    ref = _auc(auc_retain, "auc_retain")
    score, ref = 1.0 - auc, 1.0 - ref
    return (score - ref) / (ref + _PRIVLEAK_EPSILON) * 100.0


def exact_memorization(token_is_greedy: Any) -> float | None:
    """Exact memorization (``memorization.py:exact_memorization``): the fraction of the answer's tokens that are
    the model's argmax given the true prefix (teacher forcing), over the tokens ``tokenwise_logprobs`` keeps
    (:func:`without_eos`). ``None`` for no tokens (open-unlearning leaves the item out of the mean). Higher = more
    memorized; after unlearning, lower on the forget set is better."""
    hits = _flags(token_is_greedy)
    return None if hits.size == 0 else float(hits.mean())


def extraction_strength(token_is_greedy: Any) -> float:
    """Extraction strength (``memorization.py:extraction_strength``): ``1 - k / n`` for the smallest ``k`` whose
    suffix of argmax predictions (teacher forcing) equals the answer's suffix, over the ``n`` tokens
    ``tokenwise_logprobs`` keeps (:func:`without_eos`). As there: ``k`` runs over ``0 .. n-1``, so when no
    suffix matches the loop ends at ``k = n - 1`` and the score is ``1/n`` (not 0); no tokens scores 0. Higher =
    more extractable; after unlearning, lower on the forget set is better."""
    hits = _flags(token_is_greedy)
    n = hits.size
    if n == 0:
        return 0.0
    k = 0
    for k in range(n):  # open-unlearning's loop, its last k kept when nothing breaks it
        if hits[k:].all():
            break
    return 1.0 - k / n


def _auc(value: Any, name: str) -> float:
    v = as_float(value, name)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must be an AUC in [0, 1], got {v}")
    return v


def _flags(values: Any) -> np.ndarray:
    if isinstance(values, (str, bytes)):
        raise TypeError("token_is_greedy: expected a sequence of booleans, got a string")
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"token_is_greedy: expected a 1-D sequence, got shape {arr.shape}")
    if arr.size and not (arr.dtype == bool or np.isin(arr, (0, 1)).all()):
        raise ValueError("token_is_greedy: expected booleans (is the argmax the answer's token?)")
    return arr.astype(bool)
