"""Comparing methods (protocol.md, "Comparing methods"): Pareto dominance, Friedman test, Wilcoxon post-hoc.

- Pareto, per (model, split): points (Forgetting, Utility), both to maximise. A method is dominated if another
  is at least as good on both and strictly better on one. The reference row (Original) is not a competitor.
- Trade-off score of a cell, for the rank tests: the harmonic mean of Forgetting and Utility (0 when either
  is 0, so a broken model that "forgets" everything with no utility left ranks last, as it should).
  TOFU: Forgetting = 1 - forget ROUGE-L recall, Utility = Model Utility.
  RWKU: Forgetting = 1 - forget All (FB, QA, AA weighted by their item counts), Utility = mean of the
  accuracy-type utility scores present (MMLU, BBH, TruthfulQA, TriviaQA; fluency is an entropy, not in [0, 1],
  and is left out).
- Friedman over blocks = (model, split) on TOFU and (model, target) on RWKU; mean ranks with 1 = best. Its p-value
  is a permutation p (`scipy.stats.permutation_test` of `friedmanchisquare`'s statistic, the methods' scores
  rearranged within each block): exact over every arrangement when there are at most `PERMUTATIONS` of them, else
  that many random ones (seeded). The chi-square approximation's p is kept beside it; with few blocks it is off
  either way (4 blocks x 3 methods: 0.050 where the exact p is 0.069 for chi2 = 6, 0.018 against 0.005 for 8).
- Which methods and blocks enter: a method with a score in fewer than half of the blocks is left out (a setting
  run on one split only would otherwise leave no block where every method has a score), then every block where
  a remaining method has none. Both are named.
- Wilcoxon signed-rank (`scipy.stats.wilcoxon`, two-sided) of the best-ranked method against each other, with
  Holm-adjusted p-values over the tests run (the best method is chosen on the same blocks, and there are k - 1
  tests). A tie for the best mean rank is said, and the first in name order is taken.
When there are too few methods or blocks the result says so (`status: "too_few"` and a message), no number.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np

FRIEDMAN_MIN_METHODS = 3   # scipy's friedmanchisquare needs at least 3 samples
FRIEDMAN_MIN_BLOCKS = 4    # 3 blocks x 3 methods: 216 arrangements, the smallest p 1/36; too few to say much
PERMUTATIONS = 9999        # the permutation p's arrangements: all of them when (k!)**n is at most this
# With n non-zero paired differences the smallest two-sided exact p-value is 2 / 2**n: n = 5 gives 0.0625, so
# fewer than 6 pairs can never reach 0.05 -- printing such a p-value would only look like evidence.
WILCOXON_MIN_PAIRS = 6


def is_number(value) -> bool:
    """A finite int or float (not a bool, None, NaN or inf): the values tables, plots and tests average."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def finite_mean(values: Iterable) -> float | None:
    """The mean of the values that are numbers (`is_number`); None when there are none. The sum is exact
    (`math.fsum`), so the mean does not depend on the order the cells were read in."""
    kept = [v for v in values if is_number(v)]
    return math.fsum(kept) / len(kept) if kept else None


def pareto_dominated(points: Mapping[str, tuple[float, float]]) -> dict[str, bool]:
    """label -> True if some other point is >= on both coordinates and > on one (both maximised).

    Points with a missing coordinate are not compared (reported as not dominated = unknown -> False)."""
    flags = {}
    for label, (x, y) in points.items():
        if not (is_number(x) and is_number(y)):
            flags[label] = False
            continue
        flags[label] = any(
            is_number(ox) and is_number(oy) and ox >= x and oy >= y and (ox > x or oy > y)
            for other, (ox, oy) in points.items() if other != label)
    return flags


def tradeoff_score(forgetting: float | None, utility: float | None) -> float | None:
    if not (is_number(forgetting) and is_number(utility)):
        return None
    if forgetting <= 0 or utility <= 0:
        return 0.0
    return 2 * forgetting * utility / (forgetting + utility)


def rank_within_blocks(scores: np.ndarray) -> np.ndarray:
    """scores[block, method] (higher better) -> ranks with 1 = best, ties averaged."""
    from scipy.stats import rankdata

    return np.vstack([rankdata(-row, method="average") for row in scores])


def complete_blocks(scores: Mapping[Any, Mapping[str, float]], methods: list[str] | None = None
                    ) -> tuple[list[str], list[Any], np.ndarray, list[Any]]:
    """Keep the blocks where every method has a finite score. Returns (methods, blocks, matrix, dropped). Without
    `methods`: those with a score in at least half of the blocks (`compared_methods`)."""
    if methods is None:
        methods = compared_methods(scores)[0]
    kept, dropped, rows = [], [], []
    for block, values in scores.items():
        if all(is_number(values.get(m)) for m in methods):
            kept.append(block)
            rows.append([float(values[m]) for m in methods])
        else:
            dropped.append(block)
    matrix = np.array(rows, dtype=float).reshape(len(rows), len(methods))
    return methods, kept, matrix, dropped


def compared_methods(scores: Mapping[Any, Mapping[str, float]]) -> tuple[list[str], list[str]]:
    """(kept, left out): the methods with a finite score in at least half of the blocks, and the others."""
    counts: dict[str, int] = {}
    for values in scores.values():
        for method, value in values.items():
            counts[method] = counts.get(method, 0) + is_number(value)
    kept = sorted(m for m, n in counts.items() if n and 2 * n >= len(scores))
    return kept, sorted(set(counts) - set(kept))


def friedman(scores: Mapping[Any, Mapping[str, float]], methods: list[str] | None = None) -> dict[str, Any]:
    """Friedman test over blocks. `scores[block][method]`, higher = better."""
    from scipy.stats import friedmanchisquare, permutation_test

    methods, dropped_methods = (methods, []) if methods is not None else compared_methods(scores)
    methods, blocks, matrix, dropped = complete_blocks(scores, methods)
    out: dict[str, Any] = {"test": "friedman", "methods": methods, "n_blocks": len(blocks), "blocks": blocks,
                           "dropped_blocks": dropped, "dropped_methods": dropped_methods, "statistic": None,
                           "pvalue": None, "pvalue_method": None, "pvalue_chi2": None, "mean_ranks": None}
    if len(blocks):
        ranks = rank_within_blocks(matrix)
        out["mean_ranks"] = dict(zip(methods, ranks.mean(axis=0).round(6).tolist()))
    if not methods:
        out.update(status="too_few", message="Friedman test not computed: no method has a trade-off score (it "
                   "needs both Forgetting and Utility)")
        return out
    if len(methods) < FRIEDMAN_MIN_METHODS:
        out.update(status="too_few", message=f"Friedman test not computed: {len(methods)} method(s) compared, "
                   f"it needs at least {FRIEDMAN_MIN_METHODS}")
        return out
    if len(blocks) < FRIEDMAN_MIN_BLOCKS:
        out.update(status="too_few", message=f"Friedman test not computed: too few blocks ({len(blocks)} complete "
                   f"block(s); at least {FRIEDMAN_MIN_BLOCKS} needed)")
        return out
    if np.all(matrix == matrix[:, :1]):
        out.update(status="too_few", message="Friedman test not computed: all methods tie in every block")
        return out
    result = friedmanchisquare(*matrix.T)
    permuted = permutation_test(tuple(matrix.T), lambda *s, axis: friedmanchisquare(*s, axis=axis).statistic,
                                vectorized=True, permutation_type="samples", alternative="greater",
                                n_resamples=PERMUTATIONS, random_state=0)
    arrangements = math.factorial(len(methods)) ** len(blocks)
    how = (f"exact over all {arrangements:,} within-block arrangements" if arrangements <= PERMUTATIONS else
           f"{PERMUTATIONS:,} random within-block arrangements, seed 0")
    out.update(status="ok", statistic=float(result.statistic), pvalue=float(permuted.pvalue), pvalue_method=how,
               pvalue_chi2=float(result.pvalue),
               message=f"Friedman chi2 = {result.statistic:.3f}, permutation p = {permuted.pvalue:.3g} ({how}; "
                       f"chi-square approximation {result.pvalue:.3g}) over {len(blocks)} blocks")
    return out


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment of p-values for multiple tests (each adjusted p is compared with the level)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for position, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - position) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def wilcoxon_posthoc(scores: Mapping[Any, Mapping[str, float]], methods: list[str] | None = None,
                     best: str | None = None) -> dict[str, Any]:
    """Wilcoxon signed-rank tests of the best method (lowest mean rank, unless given) against each other."""
    from scipy.stats import wilcoxon

    methods, blocks, matrix, _ = complete_blocks(scores, methods)
    out: dict[str, Any] = {"test": "wilcoxon", "best": None, "comparisons": []}
    if not len(blocks) or len(methods) < 2:
        out["message"] = "Wilcoxon post-hoc not computed: fewer than 2 methods with complete blocks"
        return out
    mean_ranks = rank_within_blocks(matrix).mean(axis=0)
    tied = [m for m, r in zip(methods, mean_ranks) if math.isclose(r, mean_ranks.min(), abs_tol=1e-12)]
    best = best or tied[0]
    out["best"] = best
    if best in tied and len(tied) > 1:
        out["tied_best"] = tied
    b = methods.index(best)
    for j, other in enumerate(methods):
        if j == b:
            continue
        diff = matrix[:, b] - matrix[:, j]
        nonzero = int(np.count_nonzero(diff))
        entry = {"method": other, "n_pairs": len(diff), "n_nonzero": nonzero, "statistic": None, "pvalue": None,
                 "median_difference": float(np.median(diff))}
        if nonzero < WILCOXON_MIN_PAIRS:
            entry.update(status="too_few", message=f"{best} vs {other}: too few pairs for a Wilcoxon test "
                         f"({nonzero} non-zero difference(s); at least {WILCOXON_MIN_PAIRS} needed)")
        else:
            result = wilcoxon(matrix[:, b], matrix[:, j])
            entry.update(status="ok", statistic=float(result.statistic), pvalue=float(result.pvalue))
        out["comparisons"].append(entry)
    tested = [c for c in out["comparisons"] if c["status"] == "ok"]
    if tested:   # what the p-values below are (with no test run, each comparison says why)
        out["message"] = (f"Wilcoxon signed-rank tests of the best mean rank, {best}, against each other method "
                          f"over the same {len(blocks)} block(s) it was chosen on; Holm-adjusted p over the "
                          f"{len(tested)} test(s) run")
        if out.get("tied_best"):
            out["message"] += f" ({', '.join(tied)} tie on mean rank: the first in name order is taken)"
    for entry, adjusted in zip(tested, holm([c["pvalue"] for c in tested])):
        entry.update(pvalue_holm=adjusted, message=f"{best} vs {entry['method']}: W = {entry['statistic']:.3g}, "
                     f"p = {entry['pvalue']:.3g}, Holm-adjusted over {len(tested)} test(s) {adjusted:.3g}")
    return out
