"""TOFU's settings of the methods (`api.Benchmark.method_defaults`): the trainers' dataclass defaults are TOFU's
protocol (lr 1e-5, weight decay 0.01, AdamW, 1 warmup epoch with linear warmup and decay, effective batch 32, 5
epochs); only SimNPO's strength depends on the split."""
from __future__ import annotations

from typing import Any, Collection

from ...errors import InputError

#: SimNPO per the protocol: forget10 beta 4.5 / weight 0.125, forget05 beta 2.5 / weight 0.1375 (gamma 0).
SIMNPO = {"forget10": dict(beta=4.5, forget_weight=0.125), "forget05": dict(beta=2.5, forget_weight=0.1375)}
#: On a split without protocol defaults (forget01), these given explicitly stand in for them.
SIMNPO_KEYS = ("beta", "forget_weight")


def method_defaults(method: str, split: str | None, given: Collection[str], splits: Collection[str]) -> dict[str, Any]:
    """`splits`: TOFU's forget splits (a corpus that is none of them, a file, has no split's setting)."""
    if method != "SimNPO" or split is None or split not in splits:
        return {}
    if split in SIMNPO:
        return dict(SIMNPO[split])
    if set(SIMNPO_KEYS) <= set(given):
        return {}
    raise InputError(f"SimNPO has protocol defaults for forget05 and forget10 only, not {split!r}; "
                     "pass beta and forget_weight explicitly")
