"""`cru-harness score`: TOFU's cross-task numbers (Model Utility, Forget Quality) from lm-eval output directories.

lm-eval scores each TOFU task on its own; the numbers the TOFU paper reports combine tasks (Model Utility: the
harmonic mean of 9 numbers from three utility tasks) or two models (Forget Quality: a KS test between the
evaluated model's and the retain model's per-item truth ratios on the same forget items). This module reads
lm-eval's `--output_path` files (`results_<date>.json` + `samples_<task>_<date>.jsonl`, the latter written by
`--log_samples`), writes the per-item values of every run to `per_item.jsonl` and the numbers to `scores.json`.
The command is a plugin command (entry-point group `cru_harness.commands`: `add_score_parser`), so the core CLI
never names it.

A number that cannot be computed (no retain model, a task missing from the run, NaN values from a plain `hf`
run) is reported as unavailable with the reason; it never raises.

The retain model's per-item truth ratios (Forget Quality) come from its lm-eval run, a `per_item.jsonl` of it, or
open-unlearning's TOFU evaluation of it (`TOFU_EVAL.json`: `forget_truth_ratio` -> `value_by_index` ->
{index: {"score": R}}, the same per-item R = P_wrong / P_right; its published retain-model logs), matched to
this run's items by dataset index (lm-eval's `doc_id`).

Python API: `load_run(dir)`, `score_runs([dirs], retain_run=..., retain_per_item=..., retain_logs=...,
original_model=...)`, `write_outputs(report, out_dir)`, `read_per_item(path)`, `read_retain_logs(path)`.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError, MissingInputError
from ...scoring.outputs import ScoreInputError, generation_prompt, jsonl_rows

#: lm-eval task name -> (role, TOFU probe config). Roles: "forget" or the utility set's name.
TOFU_TASKS: dict[str, tuple[str, str]] = {
    "tofu_forget01": ("forget", "forget01_perturbed"),
    "tofu_forget05": ("forget", "forget05_perturbed"),
    "tofu_forget10": ("forget", "forget10_perturbed"),
    "tofu_retain": ("retain", "retain_perturbed"),
    "tofu_real_authors": ("real_authors", "real_authors_perturbed"),
    "tofu_world_facts": ("world_facts", "world_facts_perturbed"),
}
#: The prompt attacks' variants of the forget tasks (benchmarks/tofu/tasks: `tofu_forgetXX_<variant>`), scored as forget tasks.
FORGET_VARIANTS = ("paraphrase", "in_context")
TOFU_TASKS.update({f"{task}_{variant}": entry for task, entry in list(TOFU_TASKS.items()) if entry[0] == "forget"
                   for variant in FORGET_VARIANTS})
# an author window of retain_perturbed as the forget set, the rest as the retain set (`tofu_authors`; no variants)
TOFU_TASKS.update({"tofu_authors": ("forget", "retain_perturbed"),
                   "tofu_authors_retain": ("retain", "retain_perturbed")})
#: Task metrics reported where a task has them: the paraphrase variant's multiple-choice probability.
OPTIONAL_TASK_METRICS = ("mc_probability",)


def forget_task_for(split: str, tasks) -> str:
    """The forget task a cell of `split` ran: a prompt attack's variant among `tasks`, else `tofu_<split>`."""
    return next((f"tofu_{split}_{variant}" for variant in FORGET_VARIANTS if f"tofu_{split}_{variant}" in tasks),
                f"tofu_{split}")
#: The per-item values each TOFU task's `process_results` returns (see benchmarks/tofu/tasks/utils.py).
PER_ITEM_METRICS = ("rouge_l_recall", "probability", "truth_ratio", "nll_answer", "nll_paraphrased", "nll_perturbed")
PER_ITEM_FILE = "per_item.jsonl"
SCORES_FILE = "scores.json"
HF_HINT = "plain `hf` results carry no token counts; rerun with `--model cru`"
NO_RETAIN = "no retain model given"   # the start of that reason: the report may fill such a cell's FQ later

_RESULTS_RE = re.compile(r"^results_(?P<date>.+)\.json$")


# ------------------------------------------------------------------------------------------- reading


@dataclass
class TaskOutput:
    """One TOFU task of one lm-eval run: its aggregates (results JSON) and per-item rows (samples JSONL)."""

    task: str
    role: str
    tofu_config: str
    aggregates: dict[str, Any]
    results_file: Path
    samples_file: Path | None
    items: list[dict] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)   # `evaluation_settings` of its results file
    n_docs: int | None = None   # the task's items before `--limit` (lm-eval's `n-samples` -> `original`)

    @property
    def has_items(self) -> bool:
        return self.samples_file is not None


@dataclass
class LmEvalRun:
    path: Path
    label: str
    model: str
    tasks: dict[str, TaskOutput]

    def forget_tasks(self) -> list[TaskOutput]:
        return [t for t in self.tasks.values() if t.role == "forget"]


def _metric_value(aggregates: dict, name: str) -> float:
    """`name,<filter>` from an lm-eval results entry (TOFU tasks use the `none` filter)."""
    for key in (f"{name},none", name):
        if key in aggregates:
            value = aggregates[key]
            return float("nan") if value is None or value == "N/A" else float(value)
    return float("nan")


def _sample_items(path: Path, task: str) -> list[dict]:
    items = []
    for line_no, row in jsonl_rows(path):
        doc = row.get("doc") or {}
        resps = row.get("filtered_resps") or []
        generation = resps[0] if resps and isinstance(resps[0], str) else None
        if generation is None:
            raise ScoreInputError(f"{path}:{line_no}: the first response is not a generation; not a TOFU task?")
        prompt = generation_prompt(row.get("arguments"))
        item = {
            "task": task,
            "doc_id": row.get("doc_id"),
            "question": doc.get("question"),
            "answer": doc.get("answer"),
            "prompt": prompt,
            "generation": generation,
        }
        for name in PER_ITEM_METRICS:
            value = row.get(name)
            item[name] = float("nan") if value is None else float(value)
        items.append(item)
    return items


#: The evaluation settings a Forget Quality comparison needs equal in the model's and the retain model's runs.
COMPARED_SETTINGS = ("limit", "chat_template", "system_instruction", "gen_kwargs", "tofu_preset",
                     "tofu_model_family")


def evaluation_settings(data: dict, task: str) -> dict[str, Any]:
    """What an lm-eval results file says one task was evaluated under: the model arguments, `--limit`, whether a
    chat template was applied, `--system_instruction`, `--gen_kwargs` and the task's TOFU preset."""
    config = data.get("config") or {}
    metadata = ((data.get("configs") or {}).get(task) or {}).get("metadata") or {}
    return {"model_args": config.get("model_args"), "limit": config.get("limit"),
            "chat_template": bool(data.get("chat_template_sha") or data.get("chat_template")),
            "system_instruction": data.get("system_instruction"), "gen_kwargs": config.get("gen_kwargs") or {},
            "tofu_preset": metadata.get("tofu_preset"), "tofu_model_family": metadata.get("tofu_model_family")}


def load_run(run_dir: str | Path, label: str | None = None) -> LmEvalRun:
    """Every TOFU task found in an lm-eval output directory (searched recursively; for a task present in
    several results files the newest one wins). Tasks run with `--predict_only`, or chosen from the results of
    different models (lm-eval writes runs of one base with other bundles into one subfolder), are refused."""
    root = Path(run_dir)
    if not root.exists():
        raise MissingInputError(f"run directory not found: {root}")
    files = [root] if root.is_file() else sorted(root.rglob("results_*.json"))
    found: dict[str, tuple[str, TaskOutput]] = {}
    model = ""
    for results_file in files:
        match = _RESULTS_RE.match(results_file.name)
        if not match:
            continue
        date_id = match.group("date")
        try:
            data = json.loads(results_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ScoreInputError(f"{results_file}: not valid JSON ({err})") from err
        config = data.get("config") or {}
        for task, aggregates in (data.get("results") or {}).items():
            if task not in TOFU_TASKS:
                continue
            if task in found and found[task][0] >= date_id:
                continue
            if "bypass,none" in aggregates:
                raise ScoreInputError(f"{results_file}: {task} was run with --predict_only (lm-eval computed no "
                                      f"values); rerun it without --predict_only")
            role, tofu_config = TOFU_TASKS[task]
            samples = results_file.parent / f"samples_{task}_{date_id}.jsonl"
            n_docs = ((data.get("n-samples") or {}).get(task) or {}).get("original")
            out = TaskOutput(task, role, tofu_config, dict(aggregates), results_file,
                             samples if samples.is_file() else None, settings=evaluation_settings(data, task),
                             n_docs=n_docs if isinstance(n_docs, int) else None)
            if out.samples_file is not None:
                out.items = _sample_items(out.samples_file, task)
            found[task] = (date_id, out)
            model = str(config.get("model_args") or config.get("model") or model)
    if not found:
        raise ScoreInputError(
            f"no lm-eval results for TOFU tasks under {root} (expected results_*.json from "
            f"`lm_eval --output_path ... --tasks tofu_forget10_suite`)"
        )
    models = {json.dumps(out.settings["model_args"], sort_keys=True, default=str): out for _, out in found.values()}
    if len(models) > 1:
        named = "; ".join(f"{out.task} ({out.results_file.name}): {out.settings['model_args']}"
                          for out in models.values())
        raise ScoreInputError(f"{root} holds the newest results of different models: {named}; give each model (and "
                              f"router set) its own lm-eval --output_path")
    return LmEvalRun(root, label or str(run_dir), model, {task: out for task, (_, out) in sorted(found.items())})


def read_per_item(path: str | Path) -> list[dict]:
    """Rows of a `per_item.jsonl` written by `score` (null values read back as NaN)."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"per-item file not found: {path}")
    rows = []
    for line_no, row in jsonl_rows(path):
        for key in ("task", "question", "truth_ratio"):
            if key not in row:
                raise ScoreInputError(f"{path}:{line_no}: missing field {key!r}")
        row["truth_ratio"] = float("nan") if row["truth_ratio"] is None else float(row["truth_ratio"])
        rows.append(row)
    return rows


@dataclass
class RetainLogs:
    """open-unlearning's evaluation of a retain model: its per-item forget truth ratios by dataset index."""

    path: Path
    truth_ratios: dict[int, float]

    @property
    def label(self) -> str:
        return f"{self.path} (open-unlearning)"


#: Where open-unlearning's TOFU evaluator (`TOFU_EVAL.json`) keeps the forget set's per-item truth ratios.
RETAIN_LOGS_KEY = "forget_truth_ratio"


def read_retain_logs(path: str | Path) -> RetainLogs:
    """The per-item forget truth ratios of open-unlearning's TOFU evaluation of a retain model (`TOFU_EVAL.json`:
    `forget_truth_ratio` -> `value_by_index` -> {index: {"score": R}}). Another file is a ScoreInputError."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"retain logs not found: {path}")
    not_it = f"{path}: not open-unlearning's TOFU evaluation of a retain model (TOFU_EVAL.json)"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ScoreInputError(f"{not_it}: not valid JSON ({err})") from err
    entry = data.get(RETAIN_LOGS_KEY) if isinstance(data, dict) else None
    by_index = entry.get("value_by_index") if isinstance(entry, dict) else None
    if not isinstance(by_index, dict) or not by_index:
        raise ScoreInputError(f'{not_it}: expected {RETAIN_LOGS_KEY} -> value_by_index -> {{index: {{"score": '
                              f'truth ratio}}}}')
    ratios: dict[int, float] = {}
    for key, value in by_index.items():
        score = value.get("score", False) if isinstance(value, dict) else False
        if not str(key).isdigit() or not (score is None or (isinstance(score, (int, float))
                                                            and not isinstance(score, bool))):
            raise ScoreInputError(f'{not_it}: {RETAIN_LOGS_KEY}.value_by_index[{key!r}] is not '
                                  f'{{"score": truth ratio}} under an item index')
        ratios[int(key)] = float("nan") if score is None else float(score)
    return RetainLogs(path, ratios)


# ------------------------------------------------------------------------------------------- numbers


def available(value: float, **extra) -> dict:
    return {"value": float(value), "available": True, "reason": None, **extra}


def unavailable(reason: str, **extra) -> dict:
    return {"value": None, "available": False, "reason": reason, **extra}


def model_utility_of(run: LmEvalRun) -> dict:
    """Model Utility of one run from its utility tasks' aggregates, or the reason it is unavailable."""
    from cru_harness import metrics as M

    names = {
        ("retain", "rouge_l_recall"): M.MU_ROUGE_RETAIN,
        ("retain", "probability"): M.MU_PROB_RETAIN,
        ("retain", "truth_ratio"): M.MU_TRUTH_RATIO_RETAIN,
        ("real_authors", "rouge_l_recall"): M.MU_ROUGE_REAL_AUTHORS,
        ("real_authors", "probability"): M.MU_PROB_REAL_AUTHORS,
        ("real_authors", "truth_ratio"): M.MU_TRUTH_RATIO_REAL_AUTHORS,
        ("world_facts", "rouge_l_recall"): M.MU_ROUGE_WORLD_FACTS,
        ("world_facts", "probability"): M.MU_PROB_WORLD_FACTS,
        ("world_facts", "truth_ratio"): M.MU_TRUTH_RATIO_WORLD_FACTS,
    }
    by_role = {t.role: t for t in run.tasks.values() if t.role != "forget"}
    missing = [f"tofu_{role}" for role in ("retain", "real_authors", "world_facts") if role not in by_role]
    if missing:
        return unavailable(f"task(s) {', '.join(missing)} not in this run (run a tofu_forgetXX_suite)")
    components = {key: _metric_value(by_role[role].aggregates, metric) for (role, metric), key in names.items()}
    nan = [key for key, value in components.items() if math.isnan(value)]
    if nan:
        return unavailable(f"{', '.join(nan)} is NaN ({HF_HINT})", components=components)
    return available(M.model_utility(components), components=components)


def _truth_ratios_by_question(items: list[dict]) -> dict[str, float]:
    return {row["question"]: float(row["truth_ratio"]) for row in items if row.get("question") is not None}


def forget_quality_of(task: TaskOutput, retain_items: list[dict] | None, retain_source: str | None) -> dict:
    """Forget Quality of one forget task against the retain model's per-item truth ratios on the same items."""
    if retain_items is None:
        return unavailable(f"{NO_RETAIN} (use --retain-run DIR, --retain-per-item FILE or --retain-logs FILE)")
    if not task.has_items:
        return unavailable(f"{task.task}: no samples file next to {task.results_file.name} (run lm-eval with "
                            f"--log_samples)")
    return forget_quality_from_items(task.task, task.items, retain_items, retain_source)


def forget_quality_from_items(task: str, items: list[dict], retain_items: list[dict],
                              retain_source: str | None) -> dict:
    """Forget Quality from two lists of `{question, truth_ratio}` rows: the items both share (by question), NaN
    refused. The one rule for the scorer and for the report's late fill (`reporting.tables`)."""
    from cru_harness import metrics as M

    ours = _truth_ratios_by_question(items)
    theirs = _truth_ratios_by_question(retain_items)
    common = [q for q in ours if q in theirs]
    extra = {"retain_source": retain_source, "n_items": len(common), "n_model_items": len(ours),
             "n_retain_items": len(theirs)}
    if not common:
        return unavailable(f"{task}: the retain model's results share no forget item with this run", **extra)
    a = np.array([ours[q] for q in common])
    b = np.array([theirs[q] for q in common])
    if np.isnan(a).any():
        return unavailable(f"{task}: this run's truth ratios are NaN ({HF_HINT})", **extra)
    if np.isnan(b).any():
        return unavailable(f"{task}: the retain model's truth ratios are NaN ({HF_HINT})", **extra)
    return available(M.forget_quality(a, b), **extra)


def _retain_logs_items(task: TaskOutput, logs: RetainLogs) -> tuple[list[dict] | None, str | None, str | None]:
    """The retain logs' truth ratios as rows of `task`'s questions, matched by dataset index (lm-eval's `doc_id`;
    open-unlearning's `value_by_index` key); an index this run did not evaluate (`--limit`) keeps a row of its own."""
    variant = next((v for v in FORGET_VARIANTS if task.task.endswith(f"_{v}")), None)
    if variant is not None:
        return None, None, f"open-unlearning's retain logs score the plain forget task, not its {variant} variant"
    if task.n_docs is not None and task.n_docs != len(logs.truth_ratios):
        return None, None, (f"the retain logs hold {len(logs.truth_ratios)} forget items, {task.task} has "
                            f"{task.n_docs}: logs of another forget split")
    by_index = {item.get("doc_id"): item.get("question") for item in task.items}
    rows = [{"question": by_index.get(index, ("index", index)), "truth_ratio": ratio}
            for index, ratio in logs.truth_ratios.items()]
    return rows, logs.label, None


def _retain_items_for(task: str, retain_run: LmEvalRun | None, retain_rows: list[dict] | None,
                      ) -> tuple[list[dict] | None, str | None, str | None]:
    """(items, source, reason-if-missing) of the retain model for one forget task."""
    if retain_run is not None:
        out = retain_run.tasks.get(task)
        if out is None:
            return None, None, f"the retain run {retain_run.label} has no {task}"
        if not out.has_items:
            return None, None, f"the retain run {retain_run.label} has no samples for {task} (--log_samples)"
        return out.items, retain_run.label, None
    if retain_rows is not None:
        rows = [row for row in retain_rows if row.get("task") == task]
        runs = sorted({str(row.get("run")) for row in rows})
        if not rows:
            return None, None, f"the retain per-item file has no rows for {task}"
        if len(runs) > 1:
            return None, None, f"the retain per-item file holds several runs for {task}: {', '.join(runs)}"
        return rows, runs[0], None
    return None, None, None


def score_runs(
    run_dirs: list[str | Path],
    *,
    retain_run: str | Path | None = None,
    retain_per_item: str | Path | None = None,
    retain_items: list[dict] | None = None,
    retain_logs: str | Path | None = None,
    original_model: str | Path | None = None,
    data_dir: str | Path | None = None,
    device: str = "cpu",
    batch_size: int = 8,
    labels: list[str] | None = None,
    device_map: str | None = None,
    dtype: str = "float32",
    trust_remote_code: bool = False,
) -> dict:
    """Score runs: `{"runs": [{label, model, tasks, model_utility, forget_quality, forgetting, failure_modes}],
    "per_item": [rows]}`. `original_model` (a HF checkpoint; for CRU the base without routers) adds each forget
    answer's NLL under it to the failure-mode classes. The retain model's per-item truth ratios (Forget
    Quality) come from `retain_run` (an lm-eval output directory), `retain_per_item` (a `per_item.jsonl`),
    `retain_items` (the same rows in memory: `task`, `question`, `truth_ratio`, `run`; the runner's retain cell) or
    `retain_logs` (open-unlearning's `TOFU_EVAL.json` of the retain model, `read_retain_logs`)."""
    if sum(x is not None for x in (retain_run, retain_per_item, retain_items, retain_logs)) > 1:
        raise InputError("give only one of --retain-run, --retain-per-item, --retain-logs (or retain_items)")
    if labels is not None and len(labels) != len(run_dirs):
        raise InputError(f"{len(labels)} labels for {len(run_dirs)} runs")
    runs = [load_run(d, label=None if labels is None else labels[i]) for i, d in enumerate(run_dirs)]
    labels = [r.label for r in runs]
    if len(set(labels)) != len(labels):
        raise InputError(f"the same run directory was given twice: {labels}")
    retain = load_run(retain_run, label=str(retain_run)) if retain_run is not None else None
    retain_rows = read_per_item(retain_per_item) if retain_per_item is not None else retain_items
    logs = read_retain_logs(retain_logs) if retain_logs is not None else None

    from cru_harness.scoring import failure_modes

    refusals, refusal_note = tofu_refusal_phrases(data_dir)
    nll_scorer = failure_modes.AnswerNLLScorer(original_model, device=device, batch_size=batch_size,
                                               device_map=device_map, dtype=dtype,
                                               trust_remote_code=trust_remote_code) \
        if original_model is not None else None

    report_runs, per_item = [], []
    for run in runs:
        limits = sorted({str(out.settings.get("limit")) for out in run.tasks.values()
                         if out.settings.get("limit") is not None})
        entry: dict[str, Any] = {
            "label": run.label,
            "model": run.model,
            "limit": ", ".join(limits) or None,   # lm-eval's --limit: fewer items than the protocol's
            "tasks": {
                name: {"tofu_config": out.tofu_config, "n_items": len(out.items) if out.has_items else None,
                       **{m: _metric_value(out.aggregates, m) for m in ("rouge_l_recall", "probability",
                                                                        "truth_ratio")},
                       **{m: _metric_value(out.aggregates, m) for m in OPTIONAL_TASK_METRICS
                          if f"{m},none" in out.aggregates}}
                for name, out in run.tasks.items()
            },
            "model_utility": model_utility_of(run),
            "forget_quality": {},
            "forgetting": {},
            "failure_modes": {},
        }
        for task in run.forget_tasks():
            items, source, reason = (_retain_logs_items(task, logs) if logs is not None
                                     else _retain_items_for(task.task, retain, retain_rows))
            if reason is not None:
                entry["forget_quality"][task.task] = unavailable(reason)
            else:
                entry["forget_quality"][task.task] = forget_quality_of(task, items, source)
                if retain is not None and (differ := settings_differ(task, retain.tasks[task.task])):
                    entry["forget_quality"][task.task]["settings_differ"] = differ
            rouge = _metric_value(task.aggregates, "rouge_l_recall")
            prob = _metric_value(task.aggregates, "probability")
            entry["forgetting"][task.task] = {
                "one_minus_rouge_l_recall": None if math.isnan(rouge) else 1.0 - rouge,
                "one_minus_probability": None if math.isnan(prob) else 1.0 - prob,
            }
            if task.has_items:
                failure_modes.annotate(task.items, nll_scorer=nll_scorer, refusal_phrases=refusals)
                entry["failure_modes"][task.task] = failure_modes.summarise(task.items) | {
                    "nll_under_original": str(original_model) if original_model is not None else None,
                    "refusal_phrases": refusal_note,
                }
            else:
                entry["failure_modes"][task.task] = unavailable("no samples file (--log_samples)")
        for out in run.tasks.values():
            for item in out.items:
                per_item.append({"run": run.label, "tofu_config": out.tofu_config, **item})
        report_runs.append(entry)
    return {"runs": report_runs, "per_item": per_item}


# ------------------------------------------------------------------------------------------- output


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    return value


def write_outputs(report: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """`per_item.jsonl` (one row per run x task x item; NaN written as null) and `scores.json`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from ...store import atomic_write_text

    per_item_path, scores_path = out_dir / PER_ITEM_FILE, out_dir / SCORES_FILE
    # atomic: a per-item file cut short by a killed process would be read back as a smaller retain set
    atomic_write_text(per_item_path, "".join(json.dumps(_json_safe(row), ensure_ascii=False) + "\n"
                                             for row in report["per_item"]))
    atomic_write_text(scores_path, json.dumps(_json_safe({"runs": report["runs"]}), indent=2, ensure_ascii=False)
                      + "\n")
    return per_item_path, scores_path


def _fmt(entry: dict) -> str:
    return f"{entry['value']:.4g}" if entry.get("available") else f"unavailable ({entry['reason']})"


def overlap_note(fq: dict) -> str | None:
    """A note when Forget Quality was computed on fewer items than the run or the retain run has."""
    shared, ours, theirs = fq.get("n_items"), fq.get("n_model_items"), fq.get("n_retain_items")
    if shared is None or ours is None or theirs is None or shared == ours == theirs:
        return None
    return (f"Forget Quality compares only the {shared} forget items both runs share: this run has {ours}, "
            f"the retain run ({fq.get('retain_source')}) {theirs}")


def settings_differ(ours: TaskOutput, theirs: TaskOutput) -> dict[str, list]:
    """The `COMPARED_SETTINGS` in which a forget task's run and the retain model's run differ: `{key: [ours,
    theirs]}`. Forget Quality compares truth ratios item by item, so they should be none."""
    return {key: [ours.settings.get(key), theirs.settings.get(key)] for key in COMPARED_SETTINGS
            if ours.settings.get(key) != theirs.settings.get(key)}


def settings_note(fq: dict) -> str | None:
    """A note when the retain run was evaluated under other settings than the model's run."""
    differ = fq.get("settings_differ")
    if not differ:
        return None
    named = ", ".join(f"{key} {ours!r} vs {theirs!r}" for key, (ours, theirs) in differ.items())
    return f"the retain run ({fq.get('retain_source')}) was evaluated under other settings: {named}"


def fq_notes(fq: dict) -> list[str]:
    return [note for note in (overlap_note(fq), settings_note(fq)) if note]


def report_notes(report: dict) -> list[str]:
    return [f"{run['label']} {task}: {note}" for run in report["runs"]
            for task, fq in run["forget_quality"].items() for note in fq_notes(fq)]


def format_report(report: dict) -> str:
    lines = []
    for run in report["runs"]:
        limit = f"  (lm-eval --limit {run['limit']}: not the full sets)" if run.get("limit") else ""
        lines.append(f"{run['label']}  [{run['model']}]{limit}")
        lines.append(f"  Model Utility: {_fmt(run['model_utility'])}")
        for task, fq in run["forget_quality"].items():
            # the README's and the report's figure: the forget set's ROUGE-L recall (lower: more forgotten)
            rouge = (run["tasks"].get(task) or {}).get("rouge_l_recall")
            shown = "n/a" if rouge is None or math.isnan(rouge) else f"{rouge:.4g}"
            lines.append(f"  {task}: forget ROUGE-L {shown} (lower: more forgotten); Forget Quality {_fmt(fq)}")
            for note in fq_notes(fq):
                lines.append(f"    note: {note}")
            fm = run["failure_modes"].get(task) or {}
            if "fractions" in fm:
                fr = ", ".join(f"{k} {v:.2f}" for k, v in fm["fractions"].items())
                lines.append(f"    answers: {fr}")
    return "\n".join(lines)


@functools.lru_cache(maxsize=8)
def tofu_refusal_phrases(data_dir: str | Path | None = None) -> tuple[tuple[str, ...], str]:
    """The default refusal stems plus TOFU's `idontknow` answers, and a note on what was used.

    When there is no local copy and the Hub is unreachable, the defaults alone are used and the note says so;
    the classes are then computed anyway. A local copy without a readable list is an error, never a silent
    fallback. Cached per process (an unreachable Hub retries slowly).
    """
    from cru_harness import metrics as M, plugins
    from cru_harness.data.sources import DataSourceError, resolve_local_dir

    try:
        extra = plugins.benchmarks.get("tofu").refusals(data_dir)
    except DataSourceError as err:
        if resolve_local_dir("tofu", data_dir) is not None:
            raise
        # no local copy and no Hub: the generic stems still catch most refusals, and the user is told in one line
        # (the Hub's retries took their time; the note also goes into scores.json)
        print("note: TOFU's refusal list could not be read (no local TOFU copy, and the Hub did not answer): the "
              "refusal class uses the default refusal phrases only; give --data-dir for the full list",
              file=sys.stderr)
        return tuple(M.DEFAULT_REFUSAL_PHRASES), f"default stems only (idontknow list unavailable: {err})"
    return tuple(M.DEFAULT_REFUSAL_PHRASES) + tuple(extra), "default stems + TOFU's idontknow answers"


# ------------------------------------------------------------------------------------------- CLI


def add_score_parser(subparsers) -> argparse.ArgumentParser:
    """Register `score` on a `cru-harness` subparsers object (the parser's `func` runs it)."""
    parser = subparsers.add_parser(
        "score",
        help="Model Utility and Forget Quality from lm-eval TOFU outputs",
        description=(
            "Read lm-eval output directories (--output_path, with --log_samples) of TOFU runs, write the "
            "per-item values (per_item.jsonl) and Model Utility / Forget Quality / failure classes (scores.json)."
        ),
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="lm-eval --output_path directory of a run")
    retain = parser.add_mutually_exclusive_group()
    retain.add_argument("--retain-run", metavar="DIR", help="lm-eval output of the retain model (Forget Quality)")
    retain.add_argument("--retain-per-item", metavar="FILE",
                        help="a per_item.jsonl written by `score` for the retain model")
    retain.add_argument("--retain-logs", metavar="FILE",
                        help="open-unlearning's TOFU evaluation of the retain model (TOFU_EVAL.json, e.g. its "
                             "published retain logs): per-item forget truth ratios, matched by item index")
    parser.add_argument("--original-model", metavar="PATH",
                        help="HF checkpoint (or testbed model) of the original model: NLL of each forget answer under "
                             "it")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="local TOFU copy, or testbed:world (for the idontknow refusal list)")
    from ...devices import add_device_arguments

    add_device_arguments(parser, dtype_help="dtype of --original-model (default float32)")
    parser.add_argument("--batch-size", type=int, default=8, help="batch size for --original-model")
    parser.add_argument("--output-dir", "-o", metavar="DIR",
                        help="where per_item.jsonl and scores.json go (default: the run directory, if one)")
    parser.add_argument("--json", action="store_true", help="print scores.json instead of the summary")
    parser.set_defaults(func=run_score)
    return parser


def run_score(args: argparse.Namespace) -> int:
    if args.output_dir is None and len(args.runs) != 1:
        raise InputError("several runs given: choose where the outputs go with --output-dir")
    if args.output_dir is not None:  # before scoring (the original model's NLLs can take a while)
        from cru_harness.locations import check_files_dir

        check_files_dir(args.output_dir, what="--output-dir")   # never among files cru-harness did not write
    from cru_harness.testbed.names import resolve_model_path

    original_model = args.original_model
    if original_model is not None:   # a missing directory in one line, before any run is read
        from cru_harness.locations import check_model_path

        original_model = check_model_path(resolve_model_path(original_model), what="--original-model")
    report = score_runs(
        args.runs, retain_run=args.retain_run, retain_per_item=args.retain_per_item, retain_logs=args.retain_logs,
        original_model=original_model, data_dir=args.data_dir, device=args.device,
        batch_size=args.batch_size, device_map=args.device_map, dtype=args.dtype,
    )
    from cru_harness.locations import make_files_dir, output_lock

    out_dir = Path(args.output_dir if args.output_dir is not None else args.runs[0])
    with output_lock(out_dir, "--output-dir"):
        # the default is the lm-eval run's own directory, written beside its outputs as it is
        make_files_dir(out_dir, own=args.output_dir is None)
        per_item_path, scores_path = write_outputs(report, out_dir)
    if args.json:
        print(scores_path.read_text(encoding="utf-8"))
        for note in report_notes(report):  # stdout stays pure JSON; the note goes to the console's stderr
            print(f"note: {note}", file=sys.stderr)
    else:
        print(format_report(report))
        print(f"wrote {per_item_path} and {scores_path}", file=sys.stderr)
    return 0
