"""The scorer of LUNAR's single-author TOFU split: the forget / retain tasks' per-item ROUGE values, averaged, and
the forget answers' failure classes."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ...scoring import failure_modes
from ...scoring.cell_scores import finite_or_none, load_samples, nll_scorer
from ...scoring.outputs import generation_prompt

#: result-schema prefix -> lm-eval task of LUNAR's single-author split; metric -> result-schema suffix.
TOFU_AUTHOR_TASKS = {"forget": "tofu_author_forget", "retain": "tofu_author_retain"}
TOFU_AUTHOR_METRICS = {"rouge1_recall": "rouge1", "rouge_l_recall": "rouge_l"}


def score_tofu_author_cell(lmeval_dir: str | Path, *, original_model: str | None = None, device: str = "cpu",
                           batch_size: int = 8, device_map=None, trust_remote_code: bool = False) -> dict[str, Any]:
    """`metrics` (forget / retain ROUGE-1 and ROUGE-L recall: the tasks' per-item values, averaged), `per_item`
    and the forget answers' failure classes of a cell on LUNAR's single-author split."""
    from cru_harness import metrics as M

    samples = load_samples(lmeval_dir)
    metrics: dict[str, float | None] = {}
    items: dict[str, list[dict]] = {}
    for prefix, task in TOFU_AUTHOR_TASKS.items():
        rows = samples.get(task) or []
        items[prefix] = [{"question": (row.get("doc") or {}).get("question"),
                          "answer": (row.get("doc") or {}).get("answer"),
                          "generation": (row.get("filtered_resps") or [""])[0],
                          "prompt": generation_prompt(row.get("arguments")),
                          **{name: row.get(name) for name in TOFU_AUTHOR_METRICS}} for row in rows]
        for metric, suffix in TOFU_AUTHOR_METRICS.items():
            values = [float(item[metric]) for item in items[prefix] if item[metric] is not None]
            metrics[f"{prefix}_{suffix}"] = finite_or_none(sum(values) / len(values)) if values else None
    per_item = {"forget_rouge1": [item["rouge1_recall"] for item in items["forget"]],
                "forget_question": [item["question"] for item in items["forget"]]}
    failure_classes, details = {}, {"tasks": {p: t for p, t in TOFU_AUTHOR_TASKS.items() if t in samples}}
    if items["forget"]:
        scorer = nll_scorer(original_model, device, batch_size, device_map, trust_remote_code)
        failure_modes.annotate(items["forget"], nll_scorer=scorer, scorer=M.rouge_l_recall_tofu)
        summary = failure_modes.summarise(items["forget"])
        failure_classes["forget"] = summary["fractions"]
        details["failure_modes"] = {"forget": {k: v for k, v in summary.items() if k != "fractions"}}
    return {"metrics": metrics, "per_item": per_item, "failure_classes": failure_classes, "details": details}
