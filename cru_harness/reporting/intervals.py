"""Item-bootstrap intervals of the report's robustness figures (docs/protocol.md, "Intervals").

A robustness figure is a mean over a row's attack cells (seeds) of each cell's mean over its forget items (the held-out
ones for an attack that showed some). Its interval resamples the forget *items*, with replacement, and recomputes the
whole figure: every cell of the row draws the same items (they are scored on the same questions), so a difference or a
share between cells keeps its pairing. Seeds are not resampled: three seeds say little about their own spread, and the
sd over seeds is shown beside the leaderboard's means. An item drawn k times counts k times in each cell's mean; a cell
none of whose items was drawn leaves that resample out.

scipy's `bootstrap` takes samples of equal length resampled as one (`paired`) or independently; a row's cells share
some items and not others (each seed's relearn slice leaves other items out), so the resampling is written here with
numpy: one seeded draw of the row's items, weights per item, the weighted means. Percentile intervals
(`CONFIDENCE`, `RESAMPLES`, `SEED`).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Mapping, Sequence

import numpy as np

#: Resamples of the items per figure, the interval's level and the generator's seed: the same every report, so a
#: regenerated report writes the same intervals.
RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 0


def describe() -> str:
    """The method, as a table's note says it."""
    return (f"[lo, hi]: {CONFIDENCE:.0%} percentile interval of {RESAMPLES:,} item-bootstrap resamples (seed {SEED}; "
            "docs/protocol.md, Intervals)")


@functools.lru_cache(maxsize=64)
def item_weights(n_items: int, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """(resamples, n_items): how often each item is drawn in each resample of `n_items` items with replacement."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_items, size=(resamples, n_items))
    weights = np.zeros((resamples, n_items))
    np.add.at(weights, (np.arange(resamples)[:, None], draws), 1.0)
    weights.setflags(write=False)   # shared between figures (cached)
    return weights


class ItemBootstrap:
    """The resamples of one figure's item universe (every question any of its cells scored). `mean(values)`: a
    cell's mean over its items (question -> value) in each resample."""

    def __init__(self, questions: Sequence[str], resamples: int = RESAMPLES, seed: int = SEED):
        self.questions = sorted(set(questions))
        self.index = {q: i for i, q in enumerate(self.questions)}
        self.weights = item_weights(len(self.questions), resamples, seed) if self.questions else None

    def mean(self, values: Mapping[str, float]) -> np.ndarray:
        """Per resample, the weighted mean of `values` over its items (NaN where none of them was drawn)."""
        mask = np.zeros(len(self.questions))
        vector = np.zeros(len(self.questions))
        for question, value in values.items():
            if value is None or not math.isfinite(value):   # an item the cell has no number for
                continue
            mask[self.index[question]] = 1.0
            vector[self.index[question]] = value
        total = self.weights @ mask
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(total > 0, (self.weights @ vector) / np.where(total > 0, total, 1.0), np.nan)


def interval(samples: np.ndarray | None) -> tuple[float, float] | None:
    """The percentile interval of a figure's resampled values (None: no resample gave a finite value)."""
    if samples is None:
        return None
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return None
    tail = (1.0 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)


def row_intervals(points: list[dict[str, Mapping[str, float] | None]],
                  figures: Mapping[str, Callable[[dict[str, np.ndarray]], np.ndarray]]) -> dict[str, tuple | None]:
    """Intervals of a row's figures. `points`: one per attack cell, name -> that cell's per-item values on the items
    it counts (None: not available, so no figure that reads it has an interval). `figures`: figure -> fn(name -> the
    mean over points of each name's resampled mean) -> resampled figure. A name missing from any point is None
    for every figure that reads it."""
    if not points:
        return {name: None for name in figures}
    names = {name for point in points for name in point}
    universe = [q for point in points for values in point.values() if values for q in values]
    boot = ItemBootstrap(universe)
    means: dict[str, np.ndarray] = {}
    for name in names:
        if boot.weights is None or any(not point.get(name) for point in points):
            continue
        means[name] = np.mean([boot.mean(point[name]) for point in points], axis=0)
    out = {}
    for figure, fn in figures.items():
        try:
            out[figure] = interval(fn(means))
        except KeyError:   # a figure reading a name without per-item values
            out[figure] = None
    return out


def fmt_interval(value, bounds: tuple[float, float] | None, digits: int = 2) -> str:
    """`value [lo, hi]`, or the value alone without an interval ("--" without a value)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return "--"
    text = f"{value:.{digits}f}"
    return text if bounds is None else f"{text} [{bounds[0]:.{digits}f}, {bounds[1]:.{digits}f}]"


def side_weights(questions: Sequence[str], seed: int = SEED,
                 resamples: int = RESAMPLES) -> tuple[list[str], np.ndarray]:
    """The sorted universe of `questions` and its resampled weights (one side of a two-sample figure: forget or
    holdout items, drawn apart, each side with its own `seed`, so each resample keeps both sides' sizes)."""
    universe = sorted(set(questions))
    return universe, item_weights(len(universe), resamples, seed) if universe else np.zeros((resamples, 0))


def auc_resamples(forget: Mapping[str, float], holdout: Mapping[str, float], forget_side, holdout_side) -> np.ndarray:
    """Per resample, the forget-vs-holdout MIA AUC (`metrics.privacy.forget_holdout_auc`: the share of (holdout,
    forget) pairs where the holdout item's loss-like score is higher, ties one half) of the resampled items:
    `forget_side` / `holdout_side` are `side_weights` of the two sets; an item the cell has no score for weighs
    nothing. Exact: the Mann-Whitney AUC of the resampled data, without a loop over resamples."""
    (f_keys, f_weights), (h_keys, h_weights) = forget_side, holdout_side
    f_scores = np.array([forget.get(q, np.nan) if forget.get(q) is not None else np.nan for q in f_keys], float)
    h_scores = np.array([holdout.get(q, np.nan) if holdout.get(q) is not None else np.nan for q in h_keys], float)
    f_w = f_weights * np.isfinite(f_scores)
    h_w = h_weights * np.isfinite(h_scores)
    f_scores, h_scores = np.nan_to_num(f_scores), np.nan_to_num(h_scores)
    pairs = (h_scores[:, None] > f_scores[None, :]) + 0.5 * (h_scores[:, None] == f_scores[None, :])
    total = h_w.sum(axis=1) * f_w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, ((h_w @ pairs) * f_w).sum(axis=1) / np.where(total > 0, total, 1.0), np.nan)


def ks_pvalue_resamples(model: Mapping[str, float], retain: Mapping[str, float]) -> np.ndarray | None:
    """Per resample of the items both scored (drawn once, the same items on both sides, as TOFU's Forget Quality
    compares the same forget items), the two-sided KS p-value (`metrics.tofu.forget_quality`) of the resampled
    truth ratios; None for fewer than two shared items."""
    from scipy.stats import ks_2samp

    shared = sorted(q for q in set(model) & set(retain) if model[q] is not None and retain[q] is not None
                    and math.isfinite(model[q]) and math.isfinite(retain[q]))
    if len(shared) < 2:
        return None
    rng = np.random.default_rng(SEED)
    draws = rng.integers(0, len(shared), size=(RESAMPLES, len(shared)))
    a = np.array([model[q] for q in shared])[draws]
    b = np.array([retain[q] for q in shared])[draws]
    return np.asarray(ks_2samp(a, b, axis=1).pvalue, dtype=float)
