"""The forget slice of the attacks that show the model some forget items and score the others ("held out"):
`relearn` trains on the slice, `in_context` puts slice pairs before each held-out question. One rule, so both
attacks, with one seed, split a forget set the same way (docs/protocol.md, "Attacks").

Stdlib only: the TOFU task files draw the same slice.
"""
from __future__ import annotations

import random

from ..errors import InputError

#: The share of forget items in the slice unless a setting says otherwise (relearn's and in_context's default).
DEFAULT_SLICE_FRACTION = 0.25
#: How many slice pairs `in_context` puts before each held-out question: the 5-shot prompts of Doshi & Cooper
#: Stickland 2024 (arXiv:2411.12103), where 5 in-context examples brought unlearned knowledge back.
DEFAULT_IN_CONTEXT_K = 5


def check_slice_settings(fraction, size) -> None:
    """Refuse a slice fraction outside (0, 1) and a slice size that is not a positive integer (None: unset)."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise InputError(f"slice_fraction must be in (0, 1), got {fraction!r}")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise InputError(f"slice_size must be a positive integer, got {size!r}")


def forget_slice(n_items: int, *, fraction: float = DEFAULT_SLICE_FRACTION, size: int | None = None, seed: int = 0,
                 what: str = "relearn") -> tuple[list[int], list[int]]:
    """(slice, held out): sorted item indices of a forget set of `n_items`, the slice drawn with
    `random.Random(seed)` (`size` items, else round(fraction * n_items)). At least one item is held out and at least
    one is in the slice. `what` names the attack in errors."""
    check_slice_settings(fraction, size)
    if n_items < 2:
        raise InputError(f"{what}: the forget set has {n_items} item(s); a slice and held-out items need 2 or more")
    count = size if size is not None else round(fraction * n_items)
    if count >= n_items:
        raise InputError(f"{what}: slice_size {count} leaves no held-out item of the {n_items} forget items")
    count = max(1, count)
    chosen = sorted(random.Random(seed).sample(range(n_items), count))
    taken = set(chosen)
    return chosen, [i for i in range(n_items) if i not in taken]


def in_context_shots(chosen: list[int], held_out: list[int], k: int, seed: int) -> dict[int, list[int]]:
    """Per held-out item, the `k` slice items whose question-answer pairs go before its question, in prompt order:
    drawn from `chosen` only (so no held-out item is ever shown), with a generator of its own seeded by `seed`,
    independently for each held-out item in turn."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InputError(f"in_context: k must be a positive integer, got {k!r}")
    if k > len(chosen):
        raise InputError(f"in_context: k={k} pairs per question, but the slice holds {len(chosen)} forget item(s); "
                         "lower k or raise slice_fraction / slice_size")
    rng = random.Random(f"in_context:{seed}")
    return {index: rng.sample(chosen, k) for index in held_out}
