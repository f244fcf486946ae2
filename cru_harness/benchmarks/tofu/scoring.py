"""TOFU's scorer: one cell's lm-eval outputs -> the result schema (docs/results_schema.md), through
`score.score_runs` (task numbers, Model Utility, Forget Quality against the retain cell's per-item truth
ratios, per-item values, failure classes with the NLL under the original model); `per_item.jsonl` and `scores.json`
are written next to the lm-eval files, as `cru-harness score` would. Its privacy task's numbers and privleak."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...scoring.cell_scores import finite_or_none, load_samples
from . import score as tofu_score

#: result-schema prefix -> lm-eval TOFU task (the forget task is `tofu_<split>`).
TOFU_UTILITY_TASKS = {"retain": "tofu_retain", "ra": "tofu_real_authors", "wf": "tofu_world_facts"}
#: TOFU task metric -> result-schema suffix.
TOFU_METRICS = {"rouge_l_recall": "rouge_l", "probability": "prob", "truth_ratio": "truth_ratio"}


def forget_items_from_result(result: dict, forget_task: str) -> list[dict] | None:
    """A cell's per-item forget truth ratios as `score_runs(retain_items=...)` rows (None if absent): the retain
    cell's, for the cells scored against it, or any cell's, for the report's late Forget Quality."""
    per_item = (result or {}).get("per_item") or {}
    values, questions = per_item.get("forget_truth_ratio"), per_item.get("forget_question")
    if not values or not questions or len(values) != len(questions):
        return None
    run = f"{result.get('kind', 'a')} cell {result.get('hash')}"
    return [{"task": forget_task, "question": q, "truth_ratio": float("nan") if v is None else float(v), "run": run}
            for q, v in zip(questions, values)]


#: The `tofu_privacy_<split>` task's metrics, as a cell records them (open-unlearning's MIA attacks: AUC of forget
#: vs holdout; memorization on the forget set: docs/protocol.md).
PRIVACY_METRICS = {"mia_loss": "mia_auc_loss", "mia_zlib": "mia_auc_zlib", "mia_min_k": "mia_auc_min_k",
                   "mia_min_k_plus_plus": "mia_auc_min_k_plus_plus", "mia_gradnorm": "mia_auc_gradnorm",
                   "mia_reference": "mia_auc_reference",
                   "exact_memorization": "exact_memorization",
                   "extraction_strength": "extraction_strength"}
#: The attack privleak compares with the retain oracle's (open-unlearning's default: Min-K% at k = 0.4).
PRIVLEAK_AUC = "mia_auc_min_k"


def privacy_metrics(lmeval_dir: str | Path, split: str) -> dict[str, float | None]:
    """The `tofu_privacy_<split>` results of an lm-eval output directory (the newest results file that has them),
    or {} when the cell did not run that task."""
    task = f"tofu_privacy_{split}"
    newest: tuple[str, dict] | None = None
    for path in Path(lmeval_dir).rglob("results_*.json"):
        match = tofu_score._RESULTS_RE.match(path.name)
        aggregates = (json.loads(path.read_text(encoding="utf-8")).get("results") or {}).get(task) if match else None
        if aggregates and (newest is None or match.group("date") > newest[0]):
            newest = (match.group("date"), aggregates)
    if newest is None:
        return {}
    return {key: finite_or_none(tofu_score._metric_value(newest[1], name)) for name, key in PRIVACY_METRICS.items()}


def privacy_items(lmeval_dir: str | Path, split: str) -> dict[str, list]:
    """The per-item scores of privleak's attack (`PRIVLEAK_AUC`, Min-K%) from the privacy task's samples file:
    `privacy_question`, `privacy_set` (0 forget, 1 holdout, the AUC's labels) and `privacy_min_k` (the loss-like
    score), so the report can resample items for privleak's interval; {} without the samples file."""
    try:
        rows = load_samples(lmeval_dir).get(f"tofu_privacy_{split}") or []
    except tofu_score.ScoreInputError:
        return {}
    name = next(k for k, v in PRIVACY_METRICS.items() if v == PRIVLEAK_AUC)
    kept = [row for row in rows if isinstance(row.get(name), list) and len(row[name]) == 2]
    if not kept:
        return {}
    return {"privacy_question": [(row.get("doc") or {}).get("question") for row in kept],
            "privacy_set": [int(row[name][0]) for row in kept],
            "privacy_min_k": [finite_or_none(row[name][1]) for row in kept]}


def privleak_of(auc: float | None, retain_auc: float | None) -> tuple[float | None, dict]:
    """privleak (MUSE's, as open-unlearning computes it) of a cell's MIA AUC against its retain oracle's; without
    an oracle AUC, against 0.5 as open-unlearning falls back (said in the details)."""
    from ...metrics.privacy import PRIVLEAK_DEFAULT_RETAIN_AUC, privleak

    if auc is None:
        return None, {"available": False, "reason": f"no {PRIVLEAK_AUC}"}
    reference = retain_auc if retain_auc is not None else PRIVLEAK_DEFAULT_RETAIN_AUC
    source = "retain cell" if retain_auc is not None else "0.5 (no retain cell with a privacy score)"
    return privleak(auc, reference), {"available": True, "attack": PRIVLEAK_AUC, "retain_auc": reference,
                                      "retain_source": source}


def score_tofu_cell(lmeval_dir: str | Path, *, split: str, retain_items: list[dict] | None = None,
                    original_model: str | None = None, data_dir: str | None = None, device: str = "cpu",
                    batch_size: int = 8, device_map=None, trust_remote_code: bool = False,
                    retain_result: dict | None = None, forget_task: str | None = None,
                    is_oracle: bool = False) -> dict[str, Any]:
    """`metrics`, `per_item`, `failure_classes`, `details` of a TOFU cell from its lm-eval output directory.
    `forget_task`: the forget task it ran (default `tofu_<split>`; a prompt attack's variant, `score.forget_task_for`),
    whose numbers are the cell's `forget_*`. `is_oracle`: the cell is the retain oracle, its own privleak reference."""
    forget_task = forget_task or f"tofu_{split}"
    report = tofu_score.score_runs([lmeval_dir], retain_items=retain_items, original_model=original_model,
                                   data_dir=data_dir, device=device, batch_size=batch_size, labels=["cell"],
                                   device_map=device_map, trust_remote_code=trust_remote_code)
    per_item_path, scores_path = tofu_score.write_outputs(report, lmeval_dir)
    run = report["runs"][0]
    metrics: dict[str, float | None] = {}
    for prefix, task in {"forget": forget_task, **TOFU_UTILITY_TASKS}.items():
        numbers = run["tasks"].get(task) or {}
        for metric, suffix in TOFU_METRICS.items():
            metrics[f"{prefix}_{suffix}"] = finite_or_none(numbers.get(metric))
    if "mc_probability" in (run["tasks"].get(forget_task) or {}):   # the paraphrase variant's multiple choice
        metrics["forget_mc_prob"] = finite_or_none(run["tasks"][forget_task]["mc_probability"])
    metrics["model_utility"] = run["model_utility"]["value"]
    fq = run["forget_quality"].get(forget_task) or tofu_score.unavailable(f"{forget_task} not evaluated")
    metrics["forget_quality"] = fq["value"]
    forget_rows = [row for row in report["per_item"] if row["task"] == forget_task]
    # ROUGE-L and probability per item too: a relearn attack's recovery is read on the items it did not train on
    per_item = {"forget_truth_ratio": [finite_or_none(r["truth_ratio"]) for r in forget_rows],
                "forget_question": [r["question"] for r in forget_rows],
                "forget_rouge_l": [finite_or_none(r.get("rouge_l_recall")) for r in forget_rows],
                "forget_prob": [finite_or_none(r.get("probability")) for r in forget_rows]}
    if any(r.get("answer_class") for r in forget_rows):   # the correct-answer rate on held-out items, with intervals
        per_item["forget_answer_class"] = [r.get("answer_class") for r in forget_rows]
    fm = run["failure_modes"].get(forget_task) or {}
    failure_classes = {"forget": fm["fractions"]} if fm.get("fractions") else {}
    details = {"model_utility": run["model_utility"], "forget_quality": fq,
               "failure_modes": {"forget": {k: v for k, v in fm.items() if k != "fractions"}},
               "scores_file": str(scores_path)}
    privacy = privacy_metrics(lmeval_dir, split)
    if privacy:   # the cell ran the split's tofu_privacy task
        metrics.update(privacy)
        per_item.update(privacy_items(lmeval_dir, split))
        retain_auc = ((retain_result or {}).get("metrics") or {}).get(PRIVLEAK_AUC)
        if is_oracle:   # 0 by definition, as the report computes it, not a number against the 0.5 fallback
            retain_auc = privacy.get(PRIVLEAK_AUC)
        metrics["privleak"], details["privleak"] = privleak_of(privacy.get(PRIVLEAK_AUC), retain_auc)
        if is_oracle and retain_auc is not None:
            details["privleak"]["retain_source"] = "this cell (the retain oracle)"
    return {"metrics": metrics, "per_item": per_item, "failure_classes": failure_classes, "details": details,
            "artifacts": {"per_item": str(per_item_path), "scores": str(scores_path)}}
