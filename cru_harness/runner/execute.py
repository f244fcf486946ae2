"""Running cells: the loop (skip finished, resume interrupted, record everything) and the real executor.

An executor is any callable `executor(cell, workdir) -> dict` returning the executed part of a result:
`metrics`, `per_item`, `failure_classes`, `gate_means`, `resources`, `artifacts`, `details` (all optional).
It raises `CellUnavailable(reason)` when the cell cannot run for a reason outside the code (a PURGE checkpoint
that is not published or not reachable): the cell is recorded with status "unavailable", never a crash.
Any other exception is recorded as status "failed" with its traceback, and the run goes on.

`execute_cell` is the real executor: train (CRU via `cru.train.train_routers`, baselines via
`cru_harness.baselines`), evaluate with lm-eval's `simple_evaluate` and the `cru` model on the project tasks,
then score. Tests inject fake executors to exercise the machinery without models.
"""
from __future__ import annotations

import math
import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

from .cache import CellStore, environment_record, now_iso, read_json
from .plan import Cell

RESULT_SCHEMA_VERSION = 1
Executor = Callable[[Cell, Path], dict]


class CellUnavailable(RuntimeError):
    """The cell cannot be computed for an external reason (e.g. a PURGE checkpoint not published / Hub down)."""

    def __init__(self, reason: str, details: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.details = details or {}


# --------------------------------------------------------------------------------------------------- resources
class PeakRSSSampler:
    """Peak resident memory of this process *during* a block (sampled), unlike ru_maxrss's lifetime maximum."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()

    def _rss(self) -> int:
        try:
            import psutil

            return int(psutil.Process().memory_info().rss)
        except Exception:
            return 0

    def _loop(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            self._stop.wait(self.interval)

    def __enter__(self):
        self.peak = self._rss()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())


# --------------------------------------------------------------------------------------------------- the loop
def result_header(cell: Cell) -> dict[str, Any]:
    return {"schema_version": RESULT_SCHEMA_VERSION, "hash": cell.hash, "kind": cell.kind,
            "method": cell.method, "label": cell.label, "model": cell.model.name, "model_path": cell.model.path,
            "benchmark": cell.benchmark, "split": cell.split, "target": cell.target, "unit": cell.unit,
            "seed": cell.seed, "hparams": cell.hparams}


def run_cells(cells: Iterable[Cell], store: CellStore, executor: Executor, *, log: Callable[[str], None] = print,
              force: bool = False) -> dict[str, int]:
    """Run every unfinished cell, one at a time. Returns counts per outcome (skipped, ok, failed, unavailable)."""
    cells = list(cells)
    counts = {"skipped": 0, "ok": 0, "failed": 0, "unavailable": 0}
    for position, cell in enumerate(cells, start=1):
        tag = f"[{position}/{len(cells)}] {cell.hash} {cell.describe()}"
        if not force and store.is_finished(cell.hash):
            counts["skipped"] += 1
            log(f"{tag}: finished earlier, skipped")
            continue
        if store.was_interrupted(cell.hash):
            log(f"{tag}: interrupted earlier; recomputing from scratch")
        workdir = store.work_dir(cell.hash, fresh=True)
        store.mark_running(cell.hash)
        log(f"{tag}: running")
        result, record = run_one(cell, workdir, executor)
        store.write(cell.hash, result, record)
        counts[result["status"]] += 1
        suffix = f" ({result.get('reason')})" if result.get("reason") else ""
        log(f"{tag}: {result['status']}{suffix} in {result['resources'].get('cell_wall_time_s', 0):.1f}s")
    return counts


def run_one(cell: Cell, workdir: Path, executor: Executor) -> tuple[dict, dict]:
    started_iso, t0 = now_iso(), time.perf_counter()
    status, reason, error, outcome = "ok", None, None, {}
    with PeakRSSSampler() as sampler:
        try:
            outcome = executor(cell, workdir) or {}
        except CellUnavailable as err:
            status, reason, outcome = "unavailable", err.reason, {"details": err.details}
        except Exception as err:  # recorded, and the run goes on to the next cell
            status, reason = "failed", f"{type(err).__name__}: {err}"
            error = traceback.format_exc()
    wall = time.perf_counter() - t0
    resources = dict(outcome.get("resources") or {})
    resources.setdefault("cell_wall_time_s", wall)
    resources.setdefault("cell_peak_rss_bytes", sampler.peak)
    result = {**result_header(cell), "status": status, "reason": reason,
              "metrics": outcome.get("metrics", {}), "failure_classes": outcome.get("failure_classes", {}),
              "gate_means": outcome.get("gate_means"), "resources": resources,
              "per_item": outcome.get("per_item", {}), "artifacts": outcome.get("artifacts", {}),
              "details": outcome.get("details", {}), "error": error}
    record = {"hash": cell.hash, "resolved_config": cell.resolved(), "started": started_iso, "finished": now_iso(),
              "wall_time_s": wall, "peak_rss_bytes": sampler.peak, "status": status, **environment_record()}
    return result, record


# --------------------------------------------------------------------------------------------------- real executor
def resolve_model_path(path: str) -> str:
    """`zoo:<arch>[:<variant>]` -> a cached tiny checkpoint; `smollm2` -> the offline SmolLM2; else as given."""
    if path.startswith("zoo:"):
        from ..testbed.zoo import tiny_checkpoint

        parts = path.split(":")
        arch = parts[1] if len(parts) > 1 and parts[1] else "llama"
        variant = parts[2] if len(parts) > 2 else "finetuned"
        return str(tiny_checkpoint(arch, variant))
    if path == "smollm2":
        from ..testbed.smollm import materialize_smollm2

        return str(materialize_smollm2())
    return path


def resolve_data_dir(data_dir: str | None) -> str | None:
    """`testbed:world` -> the fictitious TOFU-schema world of the testbed; else as given."""
    if data_dir == "testbed:world":
        from ..testbed.zoo import tiny_world_dir

        return str(tiny_world_dir())
    return data_dir


def _device(cell: Cell) -> str:
    if cell.device != "auto":
        return cell.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(name, "auto")


def _load(path: str, cell: Cell):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=cell.model.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=_torch_dtype(cell.model.dtype),
                                                 trust_remote_code=cell.model.trust_remote_code)
    return model.to(_device(cell)), tokenizer


def execute_cell(cell: Cell, workdir: Path) -> dict:
    """Train (if the cell's method trains), evaluate with lm-eval + the `cru` model, score. See module doc."""
    data_dir = resolve_data_dir(cell.data_dir)
    outcome: dict[str, Any] = {"resources": {}, "details": {}, "artifacts": {}}
    model_path = resolve_model_path(cell.model.path)
    routers = None
    system_instruction = None  # (ICU uses its own task variants, not lm-eval's system instruction)

    if cell.kind == "retain":
        retain = cell.extra["retain"]
        if retain["kind"] == "per_item":
            return retain_from_per_item(retain["value"])
        if retain["kind"] == "checkpoint":
            model_path = resolve_model_path(retain["value"])
        else:
            model_path = _train_retain_model(cell, retain["value"], workdir, data_dir, outcome)
    elif cell.kind == "method":
        if cell.method == "PURGE":
            from .purge import resolve_purge_checkpoint

            resolution = resolve_purge_checkpoint(cell.target, local_path=cell.extra.get("purge_local_checkpoint"),
                                                  data_dir=data_dir)
            outcome["details"]["purge"] = resolution.to_dict()
            if resolution.status != "ok":
                raise CellUnavailable(resolution.reason, {"purge": resolution.to_dict()})
            model_path = resolution.path
        elif cell.method == "ICU":  # prompt-only: the plan already swapped in the rwku_icu_* tasks
            outcome["resources"].update(train_wall_time_s=0.0, trainable_params=0)
        elif cell.method == "CRU":
            routers = _train_cru(cell, model_path, workdir, data_dir, outcome)
        else:
            model_path = _train_baseline(cell, model_path, workdir, data_dir, outcome)
    evaluation = evaluate_cell(cell, model_path, routers, workdir, data_dir, system_instruction)
    outcome["artifacts"].update(evaluation["artifacts"])
    outcome["resources"]["eval_wall_time_s"] = evaluation["wall_time_s"]
    scored = score_cell(cell, evaluation)
    outcome.update(metrics=scored.get("metrics", {}), per_item=scored.get("per_item", {}),
                   failure_classes=scored.get("failure_classes", {}))
    return outcome


def _train_cru(cell: Cell, model_path: str, workdir: Path, data_dir, outcome: dict) -> str:
    from ..baselines.resources import ResourceMonitor
    from ..cru.train import RouterTrainingConfig, train_routers
    from ..data.corpora import load_corpus

    model, tokenizer = _load(model_path, cell)
    forget = load_corpus(cell.corpora["forget_corpus"], data_dir)
    retain = load_corpus(cell.corpora["retain_corpus"], data_dir)
    config = RouterTrainingConfig(**cell.hparams, seed=cell.seed or 0, progress=False,
                                  forget_description=cell.corpora["forget_corpus"],
                                  retain_description=cell.corpora["retain_corpus"])
    with ResourceMonitor(_device(cell)) as monitor:
        bundle = train_routers(model, tokenizer, forget, retain, config)
    out = workdir / "routers"
    bundle.save_pretrained(out)
    record = monitor.record.to_dict()
    outcome["resources"].update({f"train_{k}" if k in ("wall_time_s", "peak_memory_bytes") else k: v
                                 for k, v in record.items()})
    outcome["resources"]["trainable_params"] = sum(p.numel() for p in bundle.parameters())
    metrics = dict(getattr(bundle.config, "metrics", {}) or {})
    outcome["gate_means"] = {"forget": metrics.get("forget_gate_mean"), "retain": metrics.get("retain_gate_mean"),
                             "raw": metrics}
    outcome["artifacts"]["routers"] = str(out)
    return str(out)


def _corpus_rows(source: str, data_dir) -> list[dict]:
    """Rows (question/answer or text) of a corpus source: a TOFU config, rwku:<target>:<kind>, or a JSON(L) file."""
    from ..data.tofu import TOFU_CONFIGS, load_tofu

    if source in TOFU_CONFIGS:
        return load_tofu(source, data_dir)
    if source.startswith("rwku:"):
        from ..data.rwku import load_target_file, parse_targets

        _, targets, kind = source.split(":", 2)
        return [row for t in parse_targets(targets) for row in load_target_file(t, kind, data_dir)]
    from ..data.sources import read_json_records

    return read_json_records(Path(source))


def _train_baseline(cell: Cell, model_path: str, workdir: Path, data_dir, outcome: dict) -> str:
    """A baseline via `cru_harness.baselines.unlearn` with the method's preset for this benchmark/split."""
    from ..baselines import unlearn
    from ..baselines.registry import make_config

    out = workdir / "model"
    config = make_config(cell.method, cell.benchmark, cell.split, **cell.hparams)
    forget = _corpus_rows(cell.corpora["forget_corpus"], data_dir)
    retain = _corpus_rows(cell.corpora["retain_corpus"], data_dir)
    trained = unlearn(model_path, None, forget, retain, cell.method, config, out_dir=out, seed=cell.seed or 0,
                      data_dir=data_dir, dtype=_torch_dtype(cell.model.dtype) if cell.model.dtype != "auto" else
                      _torch_dtype("float32"), progress=False)
    resources = getattr(trained, "resources", None)
    if resources is not None:
        record = resources.to_dict() if hasattr(resources, "to_dict") else dict(resources)
        outcome["resources"].update({f"train_{k}" if k in ("wall_time_s", "peak_memory_bytes") else k: v
                                     for k, v in record.items()})
    outcome["details"]["baseline_config"] = config.to_dict()
    return str(out)


def _train_retain_model(cell: Cell, spec: dict, workdir: Path, data_dir, outcome: dict) -> str:
    from ..data.corpora import load_corpus
    from ..testbed.finetune import finetune_causal_lm

    source = resolve_model_path(spec.get("from", cell.model.path))
    model, tokenizer = _load(source, cell)
    texts = load_corpus(cell.corpora["retain_corpus"], data_dir)
    t0 = time.perf_counter()
    kwargs = {k: spec[k] for k in ("epochs", "lr", "batch_size", "max_length") if k in spec}
    finetune_causal_lm(model, tokenizer, texts, seed=cell.seed or 0, **kwargs)
    outcome["resources"]["train_wall_time_s"] = time.perf_counter() - t0
    out = workdir / "retain_model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def retain_from_per_item(path: str) -> dict:
    """A retain model given as a saved per-item file: its forget truth ratios feed Forget Quality."""
    import json

    values = []
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"retain per-item file not found: {path}")
    if file.suffix == ".json":
        data = read_json(file)
        values = data.get("per_item", data).get("forget_truth_ratio", [])
    else:
        for line in file.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if row.get("task", "").startswith("tofu_forget") and row.get("truth_ratio") is not None:
                    values.append(row["truth_ratio"])
    if not values:
        raise ValueError(f"{path} holds no forget-set truth ratios (field forget_truth_ratio / truth_ratio)")
    return {"per_item": {"forget_truth_ratio": values}, "details": {"retain_source": str(path)}}


def evaluate_cell(cell: Cell, model_path: str, routers: str | None, workdir: Path, data_dir,
                  system_instruction: str | None) -> dict:
    """lm-eval `simple_evaluate` with the `cru` model on the cell's tasks; outputs saved under workdir/lmeval."""
    import json

    import lm_eval
    from lm_eval.tasks import TaskManager

    from ..lmeval.registration import register, tasks_dir

    register()
    if data_dir:
        os.environ[f"CRU_HARNESS_{cell.benchmark.upper()}_DIR"] = str(data_dir)
    metadata = {}
    if cell.target is not None:  # the RWKU tasks select targets and data through lm-eval's metadata
        metadata["rwku_targets"] = str(cell.target)
    if data_dir:
        metadata["data_dir"] = str(data_dir)
    model_args = {"pretrained": model_path, "dtype": cell.model.dtype}
    if routers:
        model_args["routers"] = routers
    if cell.model.trust_remote_code:
        model_args["trust_remote_code"] = True
    t0 = time.perf_counter()
    results = lm_eval.simple_evaluate(
        model="cru", model_args=model_args, tasks=list(cell.tasks), limit=cell.limit,
        batch_size=cell.evaluation.get("batch_size", 8), device=_device(cell), log_samples=True,
        task_manager=TaskManager(include_path=tasks_dir(), include_defaults=False),
        system_instruction=system_instruction,
        apply_chat_template=bool(cell.evaluation.get("apply_chat_template") or False),
        metadata=metadata or None,
    )
    wall = time.perf_counter() - t0
    out = workdir / "lmeval"
    out.mkdir(parents=True, exist_ok=True)
    samples = results.pop("samples", {}) or {}
    (out / "results.json").write_text(json.dumps(results, default=str, indent=1))
    with open(out / "samples.jsonl", "w") as handle:
        for task, rows in samples.items():
            for row in rows:
                handle.write(json.dumps({"task": task, **row}, default=str) + "\n")
    return {"results": results, "samples": samples, "wall_time_s": wall,
            "artifacts": {"lmeval_results": str(out / "results.json"), "lmeval_samples": str(out / "samples.jsonl")}}


# --------------------------------------------------------------------------------------------------- scoring
TOFU_TASK_PREFIX = {"retain": "tofu_retain", "ra": "tofu_real_authors", "wf": "tofu_world_facts"}


def _metric(task_results: dict, name: str) -> float | None:
    for key, value in task_results.items():
        if key.split(",")[0] == name and isinstance(value, (int, float)):
            return float(value)
    return None


def score_cell(cell: Cell, evaluation: dict) -> dict:
    """Per-cell numbers in the result schema (docs/results_schema.md) from lm-eval's outputs.

    Uses `cru_harness.reporting.score.score_results` when available (the project's scorer); otherwise reads
    the task metrics directly. Forget Quality needs the retain cell and is filled in by the report.
    """
    try:
        from ..reporting.score import score_results  # the project's scorer, when present
    except ImportError:
        score_results = None
    if score_results is not None:
        return score_results(evaluation["results"], evaluation["samples"], benchmark=cell.benchmark,
                             split=cell.split)
    results = evaluation["results"].get("results", {})
    metrics: dict[str, float | None] = {}
    per_item: dict[str, list] = {}
    if cell.benchmark == "tofu":
        forget_task = f"tofu_{cell.split}"
        sets = {"forget": forget_task, **TOFU_TASK_PREFIX}
        for short, task in sets.items():
            task_results = results.get(task, {})
            for name, key in (("rouge_l_recall", "rouge_l"), ("probability", "prob"), ("truth_ratio", "truth_ratio")):
                metrics[f"{short}_{key}"] = _metric(task_results, name)
        utility = [metrics.get(f"{s}_{k}") for s in ("retain", "ra", "wf") for k in ("rouge_l", "prob", "truth_ratio")]
        if all(v is not None and v > 0 for v in utility):
            from scipy.stats import hmean

            metrics["model_utility"] = float(hmean(utility))
        tr = [row.get("truth_ratio") for row in evaluation["samples"].get(forget_task, [])]
        per_item["forget_truth_ratio"] = [float(v) for v in tr if isinstance(v, (int, float)) and math.isfinite(v)]
    else:
        prefix = "rwku_icu_" if cell.method == "ICU" else "rwku_"
        mapping = {"forget_fb": ("fb", "rouge_l_recall"), "forget_qa": ("qa", "rouge_l_recall"),
                   "forget_aa": ("aa", "rouge_l_recall"), "neighbor_fb": ("neighbor_fb", "rouge_l_recall"),
                   "neighbor_qa": ("neighbor_qa", "rouge_l_recall"), "mia_fm_loss": ("mia", "fm_loss"),
                   "mia_rm_loss": ("mia", "rm_loss"), "mia_auc_loss": ("mia", "auc_loss"),
                   "mia_auc_minkpp": ("mia", "auc_minkpp"), "utility_mmlu": ("utility_mmlu", "acc"),
                   "utility_bbh": ("utility_bbh", "exact_match"), "utility_truthfulqa": ("utility_truthfulqa", "mc1"),
                   "utility_triviaqa": ("utility_triviaqa", "f1"),
                   "utility_fluency": ("utility_fluency", "fluency_entropy")}
        for key, (task, name) in mapping.items():
            metrics[key] = _metric(results.get(prefix + task, {}), name)
    return {"metrics": metrics, "per_item": per_item, "failure_classes": {}}
