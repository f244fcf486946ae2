"""The recovery score of an attack (issue 51): how much of what unlearning removed the attack brings back.

For a forget metric m (higher = more knowledge, e.g. TOFU's forget probability or ROUGE-L):

    recovery = (m(unlearned + attack) - m(unlearned)) / (m(original) - m(unlearned))

0: the attack brings nothing back; 1: it closes the whole Original-to-unlearned gap (above 1: past the original).
It is reported next to the oracle's own change under the same attack, m(oracle + attack) - m(oracle): an attack
that fine-tunes on forget items teaches them to the retain oracle too, so only recovery beyond the oracle's gain
is knowledge that was hidden rather than removed (the attacks: Hu et al. 2024; Łucki et al. 2024; the oracle
control is this project's addition, the papers compare with the original model). The oracle's change is
also given on the recovery scale (divided by the same gap), so the two can be compared in one table.

An attack that trains on forget items (relearn) is scored on the items it did not train on: `held_out_mean` and
`held_out_forget_metrics` restrict per-item values to those, the same items for every reference point.

Pure functions of numbers: no torch, no files.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InputError

#: A gap smaller than this (in the metric's units) leaves nothing to recover: the score is undefined (None).
MIN_GAP = 1e-9
#: The smallest gap whose recovery share a report shows (in the metric's units: ROUGE-L, probability and answer
#: rates, all in [0, 1]). The share divides by the gap, and on TOFU forget01's 30-40 items the 95% item-bootstrap
#: interval of a gap is about ±0.04 (`reporting.intervals`; in the committed robustness run GA's 0.29 [0.24, 0.33],
#: SatImp's 0.06 [0.03, 0.11]). Below 0.1, about twice that half-width, the gap's interval comes within 0.05 of
#: none and a share of it swings past ±1 for a change of a few items (WHP's gap of 0.03 gave -5.86). There the
#: report prints why (`gap < 0.1`), not the share; the absolute levels beside the oracle's stay the reading
#: (docs/protocol.md, "Recovery shares and their minimum gap").
MIN_REPORTED_GAP = 0.1


def share_shown(gap: float | None) -> bool:
    """Whether a report prints the recovery share of `gap` (`MIN_REPORTED_GAP`)."""
    return gap is not None and math.isfinite(gap) and gap >= MIN_REPORTED_GAP


def share_hidden_reason() -> str:
    """What a table prints instead of a share whose gap is under `MIN_REPORTED_GAP`."""
    return f"gap < {MIN_REPORTED_GAP:g}"


@dataclass(frozen=True)
class Recovery:
    """`score`: the share of the gap closed (None when unlearning left no gap). `gap`: m(original) - m(unlearned).
    `attacked_change`: m(unlearned + attack) - m(unlearned). `oracle_change`: m(oracle + attack) - m(oracle), and
    `oracle_score` the same on the recovery scale (None without an oracle). `excess`: score - oracle_score."""
    score: float | None
    gap: float
    attacked_change: float
    oracle_change: float | None = None
    oracle_score: float | None = None

    @property
    def excess(self) -> float | None:
        if self.score is None or self.oracle_score is None:
            return None
        return self.score - self.oracle_score


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"recovery: {what} must be a finite number, got {value!r}")
    return float(value)


def recovery_score(original: float, unlearned: float, attacked: float, *, oracle: float | None = None,
                   oracle_attacked: float | None = None, higher_is_knowledge: bool = True) -> Recovery:
    """The recovery of one forget metric. `higher_is_knowledge=False` for a metric where lower means the model
    knows more (e.g. a forget NLL): its sign is flipped first. `oracle` and `oracle_attacked` go together."""
    values = {"original": original, "unlearned": unlearned, "attacked": attacked}
    o, u, a = (_number(v, k) for k, v in values.items())
    if (oracle is None) != (oracle_attacked is None):
        raise ValueError("recovery: give both oracle and oracle_attacked, or neither")
    sign = 1.0 if higher_is_knowledge else -1.0
    gap, change = sign * (o - u), sign * (a - u)
    score = change / gap if gap > MIN_GAP else None
    oracle_change = oracle_score = None
    if oracle is not None:
        oracle_change = sign * (_number(oracle_attacked, "oracle_attacked") - _number(oracle, "oracle"))
        oracle_score = oracle_change / gap if gap > MIN_GAP else None
    return Recovery(score=score, gap=gap, attacked_change=change, oracle_change=oracle_change,
                    oracle_score=oracle_score)


def held_out_mean(values: dict[str, float], items) -> float | None:
    """The mean of per-item `values` (question -> value) over `items` (questions), every one of which must have a
    value; None for no items or a non-finite value among them."""
    items = list(items)
    if not items:
        return None
    chosen = [values[q] for q in items]
    if any(v is None or not math.isfinite(v) for v in chosen):
        return None
    return sum(chosen) / len(chosen)


def held_out_forget_metrics(per_item: list[dict], slice_questions: list[str], *,
                            retain_truth_ratios: dict[str, float] | None = None) -> dict:
    """TOFU's forget metrics over the held-out items only: `per_item` are the forget task's rows of a cell's
    `per_item.jsonl` (`question`, `rouge_l_recall`, `probability`, `truth_ratio`), the slice's rows are dropped by
    question. `retain_truth_ratios` (question -> the retain oracle's truth ratio) adds Forget Quality on the same
    held-out items. The aggregations are TOFU's (`cru_harness.metrics`)."""
    from .tofu import forget_quality, truth_ratio_forget

    taught = set(slice_questions)
    rows = [row for row in per_item if row["question"] not in taught]
    if not rows:
        raise InputError("relearn: no held-out forget item among the scored rows")
    # under a `limit` only the first items are scored, so some (or all) slice items may be absent: not an error
    out = {"n_items": len(rows), "n_slice_items_dropped": len(per_item) - len(rows),
           "forget_rouge_l": sum(r["rouge_l_recall"] for r in rows) / len(rows),
           "forget_prob": sum(r["probability"] for r in rows) / len(rows),
           "forget_truth_ratio": truth_ratio_forget([r["truth_ratio"] for r in rows]),
           "forget_quality": None}
    if retain_truth_ratios is not None:
        out["forget_quality"] = forget_quality([r["truth_ratio"] for r in rows],
                                               [retain_truth_ratios[r["question"]] for r in rows])
    return out


def taught_questions(result: dict) -> list[str] | None:
    """The forget questions an attack cell showed the model (relearn's training slice, in_context's prompt pairs;
    [] for a benign relearn), or None for an attack that shows none (its numbers count every item)."""
    details = result.get("details") or {}
    attack = details.get((details.get("attack") or {}).get("name")) or {}   # relearn's, in_context's slice
    if "slice_questions" in attack:
        return list(attack["slice_questions"] or [])
    return [] if "relearn" in details else None   # a benign relearn trains on no forget item
