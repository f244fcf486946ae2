"""Training sequences and the model's context: a sequence longer than the positions a model has is truncated
to them, with a warning that counts the rows (they would otherwise pass silently: rotary models extrapolate,
learned position tables fail with an index error). Used by CRU (`cru.train`) and the baselines."""
from __future__ import annotations

import warnings
from typing import Callable, Mapping, Sequence

# Config names families use for the number of positions, most common first.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def model_context_length(model) -> int | None:
    """The model's number of positions from its (text) config, or None when it does not say."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    get_text_config = getattr(config, "get_text_config", None)
    config = get_text_config() if callable(get_text_config) else config
    for key in _CONTEXT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def fit_to_context(model, max_length: int, lengths: Callable[[], Mapping[str, Sequence[int]]]) -> int:
    """The length to truncate training sequences to: `max_length`, or the model's context when shorter.

    `lengths()` (called only then) gives each set's sequence lengths under `max_length`; the rows longer than
    the context are counted in a warning, per set."""
    context = model_context_length(model)
    if context is None or max_length <= context:
        return max_length
    for name, values in lengths().items():
        too_long = sum(1 for n in values if n > context)
        if too_long:
            warnings.warn(f"{too_long} of {len(values)} {name} rows are longer than the model's context "
                          f"({context} tokens) and are truncated to it", RuntimeWarning, stacklevel=2)
    return context
