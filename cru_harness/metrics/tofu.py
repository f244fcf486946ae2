"""TOFU's likelihood metrics and aggregates: probability, truth ratio, Forget Quality, Model Utility.

References: locuslab/tofu (``evaluate_util.py``: ``get_all_evals``, ``eval_perturbation_ratio``;
``aggregate_eval_stat.py``: ``get_model_utility``, ``get_forget_quality``) and locuslab/open-unlearning
(``src/evals/metrics/memorization.py``: ``probability``, ``probability_w_options``, ``truth_ratio``).

The two references differ in one numerical detail: open-unlearning adds ``1e-10`` (:data:`OPEN_UNLEARNING_EPSILON`)
to three denominators - the truth ratio ``wrong / (correct + 1e-10)``, the forget aggregation
``min(x, 1 / (x + 1e-10))`` and the Real Authors / World Facts probability ``correct / (correct + wrong + 1e-10)``;
TOFU adds none. The functions take it as ``epsilon`` (default 0, TOFU's); the TOFU tasks pass the preset's
(``cru_harness.benchmarks.tofu.prompts.tofu_epsilon``). It is not negligible: once the per-token probabilities fall near 1e-10
(average NLL above ~20 nats, a collapsed model) it dominates the denominators, e.g. at NLLs 26 (paraphrased) /
26.5 (perturbed) open-unlearning's truth ratio is 0.029 and TOFU's 0.607.

All per-item inputs are **per-token average negative log-likelihoods** of an answer given its question
(``avg_nll = -mean(token log-probs)``, question tokens masked, the EOS token counted as an answer token - TOFU's
``get_batch_loss(...) / num_token_gt`` where the label sequence ends with EOS). :func:`avg_nll` turns a list
of token log-probs into that number.

Shapes: scalar functions accept a number (one item) or an array (many items) and return a float or an array.
For the perturbed answers the last axis indexes the perturbations: ``avg_nlls_perturbed`` is ``(k,)`` for one
item or ``(n_items, k)``.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import stats
from scipy.special import logsumexp

from ._checks import as_1d, as_float, check_finite, to_output

__all__ = [
    "OPEN_UNLEARNING_EPSILON",
    "avg_nll",
    "probability_from_avg_nll",
    "mc_probability",
    "truth_ratio",
    "truth_ratio_forget",
    "truth_ratio_utility",
    "forget_quality",
    "model_utility",
    "MU_ROUGE_RETAIN", "MU_PROB_RETAIN", "MU_TRUTH_RATIO_RETAIN",
    "MU_ROUGE_REAL_AUTHORS", "MU_PROB_REAL_AUTHORS", "MU_TRUTH_RATIO_REAL_AUTHORS",
    "MU_ROUGE_WORLD_FACTS", "MU_PROB_WORLD_FACTS", "MU_TRUTH_RATIO_WORLD_FACTS",
    "MODEL_UTILITY_KEYS",
]

#: open-unlearning's ``1e-10`` in the truth ratio's, the forget aggregation's and ``probability_w_options``'s
#: denominators (``src/evals/metrics/memorization.py``); TOFU's code has none.
OPEN_UNLEARNING_EPSILON = 1e-10

# Model Utility inputs, named exactly as TOFU's aggregate_eval_stat.get_model_utility names them
# (f"{metric} {task}" with task "Retain", "Real Authors", "Real World" - TOFU's name for World Facts).
MU_ROUGE_RETAIN = "ROUGE Retain"
MU_PROB_RETAIN = "Prob. Retain"
MU_TRUTH_RATIO_RETAIN = "Truth Ratio Retain"
MU_ROUGE_REAL_AUTHORS = "ROUGE Real Authors"
MU_PROB_REAL_AUTHORS = "Prob. Real Authors"
MU_TRUTH_RATIO_REAL_AUTHORS = "Truth Ratio Real Authors"
MU_ROUGE_WORLD_FACTS = "ROUGE Real World"
MU_PROB_WORLD_FACTS = "Prob. Real World"
MU_TRUTH_RATIO_WORLD_FACTS = "Truth Ratio Real World"
#: The 9 keys :func:`model_utility` requires, no more, no fewer.
MODEL_UTILITY_KEYS: tuple[str, ...] = (
    MU_ROUGE_RETAIN, MU_PROB_RETAIN, MU_TRUTH_RATIO_RETAIN,
    MU_ROUGE_REAL_AUTHORS, MU_PROB_REAL_AUTHORS, MU_TRUTH_RATIO_REAL_AUTHORS,
    MU_ROUGE_WORLD_FACTS, MU_PROB_WORLD_FACTS, MU_TRUTH_RATIO_WORLD_FACTS,
)


def _nll_array(x: Any, name: str) -> np.ndarray:
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{name}: expected numbers, got a string")
    arr = np.asarray(x, dtype=float)
    if arr.size == 0:
        raise ValueError(f"{name}: empty input")
    check_finite(arr, name)
    if (arr < 0).any():
        raise ValueError(f"{name}: an average negative log-likelihood cannot be negative (got {arr.min()})")
    return arr


def _nll_pair(true: Any, perturbed: Any, true_name: str) -> tuple[np.ndarray, np.ndarray]:
    t = _nll_array(true, true_name)
    p = _nll_array(perturbed, "avg_nlls_perturbed")
    if p.ndim != t.ndim + 1:
        raise ValueError(
            f"avg_nlls_perturbed must have one more axis (the perturbations) than {true_name}: "
            f"got shapes {p.shape} and {t.shape}")
    if p.shape[:-1] != t.shape:
        raise ValueError(f"length mismatch: {true_name} has shape {t.shape}, avg_nlls_perturbed {p.shape}")
    if p.shape[-1] == 0:
        raise ValueError("avg_nlls_perturbed: no perturbed answers")
    return t, p


def avg_nll(token_logprobs: Any) -> float:
    """Per-token average NLL of one answer: ``-mean(token_logprobs)``.

    Pass the log-probs of *every* answer token including the final EOS token, as TOFU does (its labels end
    with EOS, and ``num_token_gt`` counts it); leaving EOS out changes the probability.
    """
    lp = as_1d(token_logprobs, "token_logprobs")
    if (lp > 0).any():
        raise ValueError("token_logprobs: a log-probability cannot be positive")
    return float(-lp.mean())


def _check_epsilon(epsilon: Any) -> float:
    eps = as_float(epsilon, "epsilon")
    if eps < 0:
        raise ValueError(f"epsilon must be >= 0, got {eps}")
    return eps


def probability_from_avg_nll(avg_nll: Any) -> float | np.ndarray:
    """TOFU's "Probability" of an answer: ``exp(-avg_nll)`` (the per-token normalised probability).

    TOFU: ``np.exp(-1 * avg_gt_loss)`` (``aggregate_eval_stat.get_model_utility``, Retain/Forget files); the
    reported number is the mean over items.
    """
    return to_output(np.exp(-_nll_array(avg_nll, "avg_nll")))


def mc_probability(avg_nll_true: Any, avg_nlls_perturbed: Any, *, epsilon: float = 0.0) -> float | np.ndarray:
    """Multiple-choice probability (TOFU's Real Authors / World Facts "Prob."):
    ``p_true / (p_true + sum_j p_perturbed_j + epsilon)`` with every ``p = exp(-avg_nll)``.

    ``epsilon=0``: TOFU's ``get_model_utility`` (``avg_true_prob / avg_all_prob``). ``epsilon=1e-10``
    (:data:`OPEN_UNLEARNING_EPSILON`): open-unlearning's ``probability_w_options``
    (``correct / (correct + wrong + 1e-10)``), which differs once the probabilities approach 1e-10.
    Computed in log space (``1 / (1 + sum_j exp(nll_true - nll_j) + epsilon * exp(nll_true))``), so very large
    NLLs do not underflow.
    """
    t, p = _nll_pair(avg_nll_true, avg_nlls_perturbed, "avg_nll_true")
    eps = _check_epsilon(epsilon)
    terms = [np.zeros(t.shape + (1,)), t[..., None] - p]  # 1 and log(p_j / p_true)
    if eps > 0:
        terms.append(t[..., None] + math.log(eps))  # log(epsilon / p_true)
    log_denominator = logsumexp(np.concatenate(terms, axis=-1), axis=-1)
    return to_output(np.exp(-log_denominator))


def truth_ratio(avg_nll_paraphrased: Any, avg_nlls_perturbed: Any, *, epsilon: float = 0.0
                ) -> float | np.ndarray:
    """Per-item truth ratio ``R = P_wrong / (P_right + epsilon)``.

    ``P_right = exp(-avg_nll_paraphrased)`` (on Real Authors / World Facts pass the ``answer``'s NLL);
    ``P_wrong = exp(-mean_j avg_nll_perturbed_j)``, the geometric mean of the per-token probabilities of the
    perturbed answers. With ``epsilon=0`` (TOFU) ``R = exp(avg_nll_paraphrased - mean_j avg_nll_perturbed_j)``;
    open-unlearning's ``truth_ratio`` computes ``wrong_prob / (correct_prob + 1e-10)``
    (:data:`OPEN_UNLEARNING_EPSILON`), here ``exp(t - p) / (1 + epsilon * exp(t))`` in log space.

    TOFU stores the inverse, ``curr_stat_1 = exp(mean perturbed loss - paraphrased loss) = 1/R``, and aggregates
    ``min(x, 1/x)`` / ``max(0, 1 - 1/x)`` of it - the same numbers as :func:`truth_ratio_forget` /
    :func:`truth_ratio_utility` of ``R``; open-unlearning's ``truth_ratio`` stores ``R`` itself (wrong/true).
    """
    t, p = _nll_pair(avg_nll_paraphrased, avg_nlls_perturbed, "avg_nll_paraphrased")
    eps = _check_epsilon(epsilon)
    log_r = t - p.mean(axis=-1)
    if eps > 0:
        log_r = log_r - np.logaddexp(0.0, t + math.log(eps))  # / (1 + epsilon / P_right)
    with np.errstate(over="ignore"):
        return to_output(np.exp(log_r))


def _ratios(r: Any) -> np.ndarray:
    arr = as_1d(r, "truth ratios", allow_inf=True)
    if (arr < 0).any():
        raise ValueError("truth ratios must be >= 0 (a ratio of probabilities)")
    return arr


def truth_ratio_forget(ratios: Any, *, epsilon: float = 0.0) -> float:
    """Forget-set aggregation: ``mean(min(R, 1/(R + epsilon)))`` (1 = the model cannot tell true from false answers).

    TOFU ``get_model_utility`` (``'forget' in k``, ``epsilon=0``) / open-unlearning ``closer_to_1_better``
    (``epsilon=1e-10``; it moves the result by less than 1e-10, but is kept so the numbers are open-unlearning's
    to the last bit). ``R = 0`` or ``inf`` contributes 0.
    """
    arr = _ratios(ratios)
    eps = _check_epsilon(epsilon)
    with np.errstate(divide="ignore"):  # 1/0 = inf and 1/inf = 0: both items contribute min(...) = 0
        return float(np.mean(np.minimum(arr, 1.0 / (arr + eps) if eps > 0 else 1.0 / arr)))


def truth_ratio_utility(ratios: Any) -> float:
    """Retain / Real Authors / World Facts aggregation: ``mean(max(0, 1 - R))`` (higher = prefers the truth).

    TOFU ``get_model_utility`` (``np.maximum(0, 1 - 1/curr_stat_1)``) / open-unlearning ``true_better``.
    """
    arr = _ratios(ratios)
    return float(np.mean(np.maximum(0.0, 1.0 - arr)))


def forget_quality(truth_ratios_model: Any, truth_ratios_retain_model: Any) -> float:
    """TOFU's Forget Quality: the p-value of ``scipy.stats.ks_2samp`` (two-sided, ``method="auto"``: exact for
    small samples) between the per-item forget-set truth ratios of the evaluated model and of the retain model.

    What TOFU feeds the test (``aggregate_eval_stat.get_forget_quality``): ``exp(mean perturbed avg-loss -
    paraphrased avg-loss)`` per item, i.e. ``1/R``. The two-sided KS statistic depends only on how the pooled
    values are ordered, and ``x -> 1/x`` (or ``log x``) applied to both samples only reverses (or keeps) that
    order, so the p-value is the same whether ``R``, ``1/R`` or ``log R`` is passed; pass the per-item ``R`` of
    :func:`truth_ratio`. The samples need not have the same length (TOFU's do: same forget items).
    """
    a = _ratios(truth_ratios_model)
    b = _ratios(truth_ratios_retain_model)
    return float(stats.ks_2samp(a, b).pvalue)


def model_utility(values: Mapping[str, float]) -> float:
    """TOFU's Model Utility: ``scipy.stats.hmean`` of the 9 numbers named in :data:`MODEL_UTILITY_KEYS`
    ({ROUGE, Prob., Truth Ratio} x {Retain, Real Authors, Real World = World Facts}), each an aggregated
    number in [0, 1] (mean ROUGE-L recall; mean probability, multiple-choice form on Real Authors / World
    Facts; :func:`truth_ratio_utility`).

    As in TOFU (``get_model_utility`` calls ``hmean`` on the list): a 0 among the values gives 0 (scipy's
    ``hmean`` convention); a NaN gives NaN (with a warning naming the key) - e.g. a metric a plain ``hf`` run
    could not compute. A missing or unknown key (e.g. a forget-set number, which TOFU excludes) is a
    ``KeyError``; a value outside [0, 1] a ``ValueError``.
    """
    if not isinstance(values, Mapping):
        raise TypeError("model_utility needs a mapping of the 9 named values (see MODEL_UTILITY_KEYS)")
    missing = [k for k in MODEL_UTILITY_KEYS if k not in values]
    unknown = [k for k in values if k not in MODEL_UTILITY_KEYS]
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if unknown:
            parts.append(f"unknown {unknown}")
        raise KeyError(f"model_utility: {'; '.join(parts)}; the keys are exactly {list(MODEL_UTILITY_KEYS)}")
    nums = []
    for k in MODEL_UTILITY_KEYS:
        v = as_float(values[k], k, allow_nan=True)
        if not math.isnan(v) and not 0.0 <= v <= 1.0:
            raise ValueError(f"model_utility: {k!r} = {v} is outside [0, 1]")
        nums.append(v)
    nan_keys = [k for k, v in zip(MODEL_UTILITY_KEYS, nums) if math.isnan(v)]
    if nan_keys:
        warnings.warn(f"model_utility: NaN for {nan_keys}; Model Utility is NaN", RuntimeWarning, stacklevel=2)
        return math.nan
    if min(nums) == 0.0:
        return 0.0  # scipy.stats.hmean's value with a zero element (it may also warn)
    return float(stats.hmean(nums))
