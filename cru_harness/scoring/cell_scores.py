"""Adapter: one runner cell's lm-eval outputs -> the result schema (docs/results_schema.md), via the project scorers.

There is one scoring path. The runner saves lm-eval's outputs exactly as `lm_eval --output_path ... --log_samples`
does (`results_<date>.json` + `samples_<task>_<date>.jsonl`), and this module scores those files with:

- each benchmark package's own scorer (`benchmarks/<name>/scoring.py`, its plugin's `score` hook; TOFU's through
  its `score.score_runs`, as `cru-harness score` would) reads the samples with `load_samples` and classifies
  failures with `scoring.failure_modes` (NLL under the original model, `nll_scorer`).

Here only names are mapped (lm-eval task/metric -> result key); no number is computed twice.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from . import failure_modes
from .outputs import ScoreInputError

_SAMPLES_RE = re.compile(r"^samples_(?P<task>.+)_(?P<date>\d{4}-\d{2}-\d{2}T[\d\-.]+)\.jsonl$")


def finite_or_none(value) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def nll_scorer(original_model, device: str, batch_size: int, device_map=None, trust_remote_code: bool = False):
    return None if original_model is None else failure_modes.AnswerNLLScorer(
        original_model, device=device, batch_size=batch_size, device_map=device_map,
        trust_remote_code=trust_remote_code)


# ---------------------------------------------------------------------------------------------------- samples
def load_samples(lmeval_dir: str | Path) -> dict[str, list[dict]]:
    """`{task: rows}` of every `samples_<task>_<date>.jsonl` under an lm-eval output directory (newest wins)."""
    found: dict[str, tuple[str, Path]] = {}
    for path in Path(lmeval_dir).rglob("samples_*.jsonl"):
        match = _SAMPLES_RE.match(path.name)
        if not match:
            continue
        task, date = match.group("task"), match.group("date")
        if task not in found or found[task][0] < date:
            found[task] = (date, path)
    if not found:
        raise ScoreInputError(f"no lm-eval samples files (samples_<task>_<date>.jsonl) under {lmeval_dir}")
    samples = {}
    for task, (_, path) in sorted(found.items()):
        with open(path, encoding="utf-8") as handle:
            samples[task] = [json.loads(line) for line in handle if line.strip()]
    return samples
