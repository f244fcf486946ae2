"""A WMDP cell's numbers from lm-eval's saved results: accuracy on each WMDP domain (the forget probes), on MMLU
overall and on its close subjects; lm-eval computes every one (`acc`), nothing is recomputed here.

Metric keys (each in [0, 1]; chance 0.25): `wmdp_<domain>_acc` for the domains the cell ran, `forget_acc` (the
cell's own domain; a joint unit `bio+cyber`: the mean of its domains'), `mmlu_acc` (lm-eval's `mmlu` group: the
mean over all questions, weighted by subject size) and `mmlu_<subject>_acc` for the four close subjects (`tasks.MMLU_SUBJECTS`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ...data.sources import DataSourceError
from .tasks import FORGET_TASKS, MMLU, MMLU_SUBJECTS

ACC = "acc,none"


def read_results(lmeval_dir: str | Path) -> dict[str, Any]:
    """The newest `results_*.json` under an lm-eval output directory (`--output_path` layout)."""
    files = sorted(Path(lmeval_dir).rglob("results_*.json"), key=lambda p: p.name)
    if not files:
        raise DataSourceError(f"no lm-eval results (results_<date>.json) under {lmeval_dir}")
    return json.loads(files[-1].read_text(encoding="utf-8"))


def _acc(results: dict, task: str) -> float | None:
    value = (results.get("results") or {}).get(task, {}).get(ACC)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _count(results: dict, task: str) -> int | None:
    counts = (results.get("n-samples") or {}).get(task) or {}
    if "effective" in counts:
        return int(counts["effective"])
    group = (results.get("results") or {}).get(task, {}).get("sample_count") or {}
    return int(group[ACC]) if ACC in group else None


def metrics_from_results(results: dict, domain: str | None) -> tuple[dict[str, float | None], dict[str, Any]]:
    """(metrics, details) of one cell from lm-eval's results: accuracies as above, and `details.items` (the
    questions each accuracy is over)."""
    metrics: dict[str, float | None] = {}
    items: dict[str, int | None] = {}
    for name, task in FORGET_TASKS.items():
        if task in (results.get("results") or {}):
            metrics[f"{task}_acc"], items[task] = _acc(results, task), _count(results, task)
    # a joint unit (`bio+cyber`): the unweighted mean of its domains' accuracies, WMDP reporting each
    accs = [metrics.get(f"{FORGET_TASKS[d]}_acc") if d in FORGET_TASKS else None for d in (domain or "").split("+")]
    metrics["forget_acc"] = sum(accs) / len(accs) if domain and None not in accs else None
    metrics["mmlu_acc"], items[MMLU] = _acc(results, MMLU), _count(results, MMLU)
    for subject, task in MMLU_SUBJECTS.items():
        metrics[f"mmlu_{subject}_acc"], items[task] = _acc(results, task), _count(results, task)
    return metrics, {"items": {task: n for task, n in items.items() if n is not None}}


def score_cell(lmeval_dir: str | Path, domain: str | None) -> dict[str, Any]:
    """The cell's `metrics` and scoring `details` (the runner files them under `details.scoring`;
    docs/results_schema.md) from its lm-eval output directory."""
    metrics, details = metrics_from_results(read_results(lmeval_dir), domain)
    return {"metrics": metrics, "per_item": {}, "failure_classes": {}, "details": details}
