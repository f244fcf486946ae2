"""Adapter: one runner cell's lm-eval outputs -> the result schema (docs/results_schema.md), via the project scorers.

There is one scoring path. The runner saves lm-eval's outputs exactly as `lm_eval --output_path ... --log_samples`
does (`results_<date>.json` + `samples_<task>_<date>.jsonl`), and this module scores those files with:

- TOFU: `scoring.score.score_runs` (task numbers, Model Utility, Forget Quality against the retain cell's per-item
  truth ratios, per-item values, failure classes with the NLL under the original model); `per_item.jsonl` and
  `scores.json` are written next to the lm-eval files, as `cru-harness score` would.
- RWKU: `cru_harness.tasks.rwku.utils.per_target_results` (per-target numbers of every task) and
  `per_item_records`; failure classes of the forget (FB, QA, AA) and neighbour answers with
  `scoring.failure_modes` (NLL under the original model).

Here only names are mapped (lm-eval task/metric -> result key); no number is computed twice.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from . import failure_modes
from . import score as tofu_score

#: result-schema prefix -> lm-eval TOFU task (the forget task is `tofu_<split>`).
TOFU_UTILITY_TASKS = {"retain": "tofu_retain", "ra": "tofu_real_authors", "wf": "tofu_world_facts"}
#: TOFU task metric -> result-schema suffix.
TOFU_METRICS = {"rouge_l_recall": "rouge_l", "probability": "prob", "truth_ratio": "truth_ratio"}
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

_SAMPLES_RE = re.compile(r"^samples_(?P<task>.+)_(?P<date>\d{4}-\d{2}-\d{2}T[\d\-.]+)\.jsonl$")


def _finite_or_none(value) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _nll_scorer(original_model, device: str, batch_size: int, device_map=None, trust_remote_code: bool = False):
    return None if original_model is None else failure_modes.AnswerNLLScorer(
        original_model, device=device, batch_size=batch_size, device_map=device_map,
        trust_remote_code=trust_remote_code)


# ----------------------------------------------------------------------------------------------------------- TOFU
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
    return {key: _finite_or_none(tofu_score._metric_value(newest[1], name)) for name, key in PRIVACY_METRICS.items()}


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
            "privacy_min_k": [_finite_or_none(row[name][1]) for row in kept]}


def privleak_of(auc: float | None, retain_auc: float | None) -> tuple[float | None, dict]:
    """privleak (MUSE's, as open-unlearning computes it) of a cell's MIA AUC against its retain oracle's; without
    an oracle AUC, against 0.5 as open-unlearning falls back (said in the details)."""
    from ..metrics.privacy import PRIVLEAK_DEFAULT_RETAIN_AUC, privleak

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
            metrics[f"{prefix}_{suffix}"] = _finite_or_none(numbers.get(metric))
    if "mc_probability" in (run["tasks"].get(forget_task) or {}):   # the paraphrase variant's multiple choice
        metrics["forget_mc_prob"] = _finite_or_none(run["tasks"][forget_task]["mc_probability"])
    metrics["model_utility"] = run["model_utility"]["value"]
    fq = run["forget_quality"].get(forget_task) or tofu_score.unavailable(f"{forget_task} not evaluated")
    metrics["forget_quality"] = fq["value"]
    forget_rows = [row for row in report["per_item"] if row["task"] == forget_task]
    # ROUGE-L and probability per item too: a relearn attack's recovery is read on the items it did not train on
    per_item = {"forget_truth_ratio": [_finite_or_none(r["truth_ratio"]) for r in forget_rows],
                "forget_question": [r["question"] for r in forget_rows],
                "forget_rouge_l": [_finite_or_none(r.get("rouge_l_recall")) for r in forget_rows],
                "forget_prob": [_finite_or_none(r.get("probability")) for r in forget_rows]}
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
                          "prompt": tofu_score.generation_prompt(row.get("arguments")),
                          **{name: row.get(name) for name in TOFU_AUTHOR_METRICS}} for row in rows]
        for metric, suffix in TOFU_AUTHOR_METRICS.items():
            values = [float(item[metric]) for item in items[prefix] if item[metric] is not None]
            metrics[f"{prefix}_{suffix}"] = _finite_or_none(sum(values) / len(values)) if values else None
    per_item = {"forget_rouge1": [item["rouge1_recall"] for item in items["forget"]],
                "forget_question": [item["question"] for item in items["forget"]]}
    failure_classes, details = {}, {"tasks": {p: t for p, t in TOFU_AUTHOR_TASKS.items() if t in samples}}
    if items["forget"]:
        scorer = _nll_scorer(original_model, device, batch_size, device_map, trust_remote_code)
        failure_modes.annotate(items["forget"], nll_scorer=scorer, scorer=M.rouge_l_recall_tofu)
        summary = failure_modes.summarise(items["forget"])
        failure_classes["forget"] = summary["fractions"]
        details["failure_modes"] = {"forget": {k: v for k, v in summary.items() if k != "fractions"}}
    return {"metrics": metrics, "per_item": per_item, "failure_classes": failure_classes, "details": details}


# ----------------------------------------------------------------------------------------------------------- RWKU
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
        raise tofu_score.ScoreInputError(f"no lm-eval samples files (samples_<task>_<date>.jsonl) under {lmeval_dir}")
    samples = {}
    for task, (_, path) in sorted(found.items()):
        with open(path, encoding="utf-8") as handle:
            samples[task] = [json.loads(line) for line in handle if line.strip()]
    return samples


def _probe(task: str) -> str | None:
    for prefix in ("rwku_icu_", "rwku_"):
        if task.startswith(prefix):
            return task[len(prefix):]
    return None


def rwku_answer_records(rows: list[dict]) -> list[dict]:
    """`failure_modes.annotate` records of one RWKU forget/neighbour task's logged samples."""
    from cru_harness.tasks.rwku.utils import NOANSWER, per_item_records

    records = []
    for sample, record in zip(rows, per_item_records(rows)):
        answer = record.get("answer")
        if answer is None:
            raise tofu_score.ScoreInputError(f"RWKU sample {sample.get('doc_id')} carries no answer in its "
                                             f"rouge_l_recall item (not a forget/neighbour probe?)")
        records.append({"generation": "" if answer == NOANSWER else answer, "answer": record.get("reference"),
                        "prompt": tofu_score.generation_prompt(sample.get("arguments")),
                        "rouge_l_recall": record.get("rouge_l_recall"), "target": record.get("target")})
    return records


def score_rwku_cell(lmeval_dir: str | Path, *, target: int, original_model: str | None = None,
                    device: str = "cpu", batch_size: int = 8, device_map=None,
                    trust_remote_code: bool = False) -> dict[str, Any]:
    """`metrics`, `failure_classes`, `details` of an RWKU cell (one target) from its lm-eval output directory."""
    from cru_harness import metrics as M
    from cru_harness.tasks.rwku.utils import per_target_results

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
        metrics[key] = None if row is None else _finite_or_none(row.get(metric))
    scorer = _nll_scorer(original_model, device, batch_size, device_map, trust_remote_code)
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
    from cru_harness.tasks.rwku.utils import per_item_records

    by_type: dict[str, list[float]] = {}
    for record in per_item_records(rows):
        if record.get("target") == int(target) and record.get("rouge_l_recall") is not None:
            by_type.setdefault(record.get("type") or "", []).append(float(record["rouge_l_recall"]))
    return {kind: {"n": len(values), "rouge_l_recall": sum(values) / len(values)}
            for kind, values in sorted(by_type.items())}
