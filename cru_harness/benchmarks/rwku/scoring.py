"""RWKU's scorer: one cell's (one target's) lm-eval samples -> the result schema's `metrics`, `failure_classes` and
`details`, through the task code's `per_target_results` / `per_item_records` (the numbers the tasks' aggregates are
made of) and the shared failure classes (`scoring.failure_modes`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ...scoring import failure_modes
from ...scoring.outputs import ScoreInputError, generation_prompt
from ...scoring.cell_scores import finite_or_none, load_samples, nll_scorer

#: RWKU result key -> (task without the `rwku_` / `rwku_icu_` prefix, per-target metric).
RWKU_METRICS = {
    "forget_fb": ("fb", "rouge_l_recall"), "forget_qa": ("qa", "rouge_l_recall"),
    "forget_aa": ("aa", "rouge_l_recall"), "neighbor_fb": ("neighbor_fb", "rouge_l_recall"),
    "neighbor_qa": ("neighbor_qa", "rouge_l_recall"), "mia_fm_loss": ("mia", "fm_loss"),
    "mia_rm_loss": ("mia", "rm_loss"), "mia_auc_loss": ("mia", "auc_loss"), "mia_auc_minkpp": ("mia", "auc_minkpp"),
    "utility_mmlu": ("utility_mmlu", "acc"), "utility_bbh": ("utility_bbh", "exact_match"),
    "utility_truthfulqa": ("utility_truthfulqa", "mc1"), "utility_triviaqa": ("utility_triviaqa", "f1"),
    "utility_fluency": ("utility_fluency", "fluency_entropy"),
}
#: failure-class group -> RWKU probes whose generated answers it classifies.
RWKU_FAILURE_GROUPS = {"forget": ("fb", "qa", "aa"), "neighbor": ("neighbor_fb", "neighbor_qa")}


def _probe(task: str) -> str | None:
    for prefix in ("rwku_icu_", "rwku_"):
        if task.startswith(prefix):
            return task[len(prefix):]
    return None


def rwku_answer_records(rows: list[dict]) -> list[dict]:
    """`failure_modes.annotate` records of one RWKU forget/neighbour task's logged samples."""
    from .tasks.utils import NOANSWER, per_item_records

    records = []
    for sample, record in zip(rows, per_item_records(rows)):
        answer = record.get("answer")
        if answer is None:
            raise ScoreInputError(f"RWKU sample {sample.get('doc_id')} carries no answer in its "
                                  f"rouge_l_recall item (not a forget/neighbour probe?)")
        records.append({"generation": "" if answer == NOANSWER else answer, "answer": record.get("reference"),
                        "prompt": generation_prompt(sample.get("arguments")),
                        "rouge_l_recall": record.get("rouge_l_recall"), "target": record.get("target")})
    return records


def score_rwku_cell(lmeval_dir: str | Path, *, target: int, original_model: str | None = None,
                    device: str = "cpu", batch_size: int = 8, device_map=None,
                    trust_remote_code: bool = False) -> dict[str, Any]:
    """`metrics`, `failure_classes`, `details` of an RWKU cell (one target) from its lm-eval output directory."""
    from cru_harness import metrics as M
    from .tasks.utils import per_target_results

    samples = load_samples(lmeval_dir)
    by_probe = {}
    for task, rows in samples.items():
        probe = _probe(task)
        if probe is not None:
            by_probe[probe] = (task, rows)
    metrics: dict[str, float | None] = {}
    per_target = {}
    for key, (probe, metric) in RWKU_METRICS.items():
        if probe not in by_probe:
            metrics[key] = None
            continue
        task, rows = by_probe[probe]
        if task not in per_target:
            per_target[task] = per_target_results(rows)
        row = per_target[task].get(int(target))
        metrics[key] = None if row is None else finite_or_none(row.get(metric))
    scorer = nll_scorer(original_model, device, batch_size, device_map, trust_remote_code)
    failure_classes, fm_details = {}, {}
    for group, probes in RWKU_FAILURE_GROUPS.items():
        records = [rec for probe in probes if probe in by_probe for rec in rwku_answer_records(by_probe[probe][1])]
        if not records:
            continue
        failure_modes.annotate(records, nll_scorer=scorer, scorer=M.rouge_l_recall_rwku)
        summary = failure_modes.summarise(records)
        failure_classes[group] = summary["fractions"]
        fm_details[group] = {k: v for k, v in summary.items() if k != "fractions"} | {
            "nll_under_original": original_model, "tasks": [by_probe[p][0] for p in probes if p in by_probe]}
    details = {"per_target": {task: {str(t): row for t, row in rows.items()} for task, rows in per_target.items()},
               "failure_modes": fm_details}
    if "aa" in by_probe:
        details["forget_aa_types"] = aa_types(by_probe["aa"][1], target)
    return {"metrics": metrics, "per_item": {}, "failure_classes": failure_classes, "details": details}


def aa_types(rows: list[dict], target: int) -> dict[str, dict]:
    """RWKU's adversarial probe per attack type (the rows' `type`: prefix injection, reverse query, role play, ...)
    for one target: `{type: {"n", "rouge_l_recall"}}`, the mean over that type's items (the paraphrase attack on
    RWKU, docs/protocol.md "Attacks")."""
    from .tasks.utils import per_item_records

    by_type: dict[str, list[float]] = {}
    for record in per_item_records(rows):
        if record.get("target") == int(target) and record.get("rouge_l_recall") is not None:
            by_type.setdefault(record.get("type") or "", []).append(float(record["rouge_l_recall"]))
    return {kind: {"n": len(values), "rouge_l_recall": sum(values) / len(values)}
            for kind, values in sorted(by_type.items())}
