"""Input validation shared by the metric modules (private)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def as_1d(values: Any, name: str, *, allow_nan: bool = False, allow_inf: bool = False,
          allow_empty: bool = False) -> np.ndarray:
    """`values` as a 1-D float array, with clear errors for the wrong shape, empty input or NaN/inf."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name}: expected a sequence of numbers, got a string")
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}: expected numbers, got {type(values).__name__} ({exc})") from None
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence, got shape {arr.shape}")
    if arr.size == 0 and not allow_empty:
        raise ValueError(f"{name}: empty input")
    check_finite(arr, name, allow_nan=allow_nan, allow_inf=allow_inf)
    return arr


def check_finite(arr: np.ndarray, name: str, *, allow_nan: bool = False, allow_inf: bool = False) -> None:
    if not allow_nan and np.isnan(arr).any():
        idx = int(np.flatnonzero(np.isnan(arr).ravel())[0])
        raise ValueError(f"{name}: NaN at position {idx} (not allowed here)")
    if not allow_inf and np.isinf(arr).any():
        idx = int(np.flatnonzero(np.isinf(arr).ravel())[0])
        raise ValueError(f"{name}: infinite value at position {idx} (not allowed here)")


def as_float(value: Any, name: str, *, allow_nan: bool = False, allow_inf: bool = False) -> float:
    """`value` as a Python float (a 0-d or 1-element array is accepted)."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name}: expected a number, got a string")
    arr = np.asarray(value, dtype=float)
    if arr.size != 1:
        raise ValueError(f"{name}: expected a single number, got shape {arr.shape}")
    out = float(arr.reshape(()))
    if math.isnan(out) and not allow_nan:
        raise ValueError(f"{name}: NaN is not allowed here")
    if math.isinf(out) and not allow_inf:
        raise ValueError(f"{name}: infinite value is not allowed here")
    return out


def check_text(text: Any, name: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f"{name}: expected str, got {type(text).__name__}")
    return text


def to_output(arr: np.ndarray) -> float | np.ndarray:
    """A 0-d result as a Python float, otherwise the array."""
    arr = np.asarray(arr, dtype=float)
    return float(arr) if arr.ndim == 0 else arr
