"""The recovery score of an attack (issue 51): how much of what unlearning removed the attack brings back.

For a forget metric m (higher = more knowledge, e.g. TOFU's forget probability or ROUGE-L):

    recovery = (m(unlearned + attack) - m(unlearned)) / (m(original) - m(unlearned))

0: the attack brings nothing back; 1: it closes the whole Original-to-unlearned gap (above 1: past the original).
It is reported next to the oracle's own change under the same attack, m(oracle + attack) - m(oracle): an attack
that fine-tunes on forget items teaches them to the retain oracle too, so only recovery beyond the oracle's gain
is knowledge that was hidden rather than removed (Hu et al. 2024; Łucki et al. 2024). The oracle's change is
also given on the recovery scale (divided by the same gap), so the two can be compared in one table.

Pure functions of numbers: no torch, no files.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

#: A gap smaller than this (in the metric's units) leaves nothing to recover: the score is undefined (None).
MIN_GAP = 1e-9


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
