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

import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

from .cache import CellStore, environment_record, now_iso, read_json
from .config import ModelSpec
from .plan import Cell
from ..lmeval.protocol import SYSTEM_PROMPT as SYSTEM_INSTRUCTION  # protocol.md, "Prompting"

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


def local_builds(config) -> list[str]:
    """The built-in models a config needs (`zoo:` checkpoints incl. retain oracles, `smollm2`), without duplicates."""
    paths: list[str] = []
    for model in config.models:
        candidates = [model.path] + [spec.value for spec in model.retain.values() if spec.kind == "checkpoint"]
        for path in candidates:
            if (path.startswith("zoo:") or path == "smollm2") and path not in paths:
                paths.append(path)
    return paths


def prebuild_local_models(config, *, workers: int = 2, log: Callable[[str], None] = print) -> None:
    """Build the config's missing built-in models up front, `workers` processes at a time.

    Each build is single-threaded by design (testbed.zoo._build_threads: deterministic, and fastest for tiny
    models), so on a cold cache two builds side by side use both cores instead of one. Builds are cached and
    locked per entry: a model already built is a no-op, and the cells later find it in the cache.
    """
    paths = local_builds(config)
    if not paths:
        return
    import concurrent.futures
    import multiprocessing

    t0 = time.perf_counter()
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch state shared with this one
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, min(workers, len(paths))),
                                                mp_context=context) as pool:
        futures = {path: pool.submit(resolve_model_path, path) for path in paths}
        for path, future in futures.items():
            try:
                log(f"model {path}: {future.result()}")
            except Exception as err:  # noqa: BLE001 - each cell of this model records the error itself
                log(f"model {path} could not be built ({type(err).__name__}: {err}); its cells will fail with it")
    log(f"built-in models ready in {time.perf_counter() - t0:.1f}s")


def resolve_data_dir(data_dir: str | None) -> str | None:
    """`testbed:world` -> the fictitious TOFU-schema world of the testbed; else as given."""
    if data_dir == "testbed:world":
        from ..testbed.zoo import tiny_world_dir

        return str(tiny_world_dir())
    return data_dir


def resolve_device(device: str) -> str:
    """A config's `device`; `auto` = cuda when available, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _device(cell: Cell) -> str:
    return resolve_device(cell.device)


def _torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(name, "auto")


def _load(path: str, cell: Cell):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=cell.model.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=_torch_dtype(cell.model.dtype),
                                                 trust_remote_code=cell.model.trust_remote_code)
    return model.to(_device(cell)), tokenizer


class PlanExecutor:
    """The real executor for one plan: `execute_cell` with what a cell needs from other cells of the run.

    A TOFU method/original cell's Forget Quality compares its per-item forget truth ratios with those of the
    retain cell of the same model and split (`plan.retain_cell_for`); the plan runs that cell first, and its
    finished result is read from the store. When it is missing or failed, Forget Quality stays null here and
    the report fills it once the retain cell exists (`reporting.tables.fill_forget_quality`).
    """

    def __init__(self, store: CellStore, cells: Iterable[Cell]):
        self.store = store
        self.cells = list(cells)

    def __call__(self, cell: Cell, workdir: Path) -> dict:
        from .plan import retain_cell_for

        retain_result = None
        if cell.benchmark == "tofu" and cell.kind != "retain":
            retain = retain_cell_for(cell, self.cells)
            if retain is not None:
                loaded = self.store.load_result(retain.hash)
                if loaded and loaded.get("status") == "ok":
                    retain_result = loaded
        return execute_cell(cell, workdir, retain_result=retain_result)


def execute_cell(cell: Cell, workdir: Path, *, retain_result: dict | None = None) -> dict:
    """Train (if the cell's method trains), evaluate with lm-eval + the `cru` model, score. See module doc.

    `retain_result`: the finished retain cell of a TOFU cell (its per-item truth ratios give Forget Quality).
    """
    data_dir = resolve_data_dir(cell.data_dir)
    outcome: dict[str, Any] = {"resources": {}, "details": {}, "artifacts": {}}
    base_path = resolve_model_path(cell.model.path)
    model_path = base_path
    routers = None

    if cell.kind == "retain":
        retain = cell.extra["retain"]
        if retain["kind"] == "per_item":
            return retain_from_per_item(retain["value"], f"tofu_{cell.split}")
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
    chat = use_chat_template(cell, model_path)
    outcome["details"]["prompting"] = {"apply_chat_template": chat,
                                       "system_instruction": SYSTEM_INSTRUCTION if chat else None}
    evaluation = evaluate_cell(cell, model_path, routers, workdir, data_dir, chat)
    outcome["artifacts"].update(evaluation["artifacts"])
    outcome["resources"]["eval_wall_time_s"] = evaluation["wall_time_s"]
    if evaluation["tasks_unavailable"]:
        outcome["details"]["tasks_unavailable"] = evaluation["tasks_unavailable"]
    # Failure classes: each answer's NLL under the original model = the cell's base model (for CRU the same
    # checkpoint with its routers detached, i.e. loaded without them).
    t0 = time.perf_counter()
    scored = score_cell(cell, evaluation["output_dir"], data_dir=data_dir, original_model=base_path,
                        retain_result=retain_result)
    outcome["resources"]["score_wall_time_s"] = time.perf_counter() - t0
    outcome.update(metrics=scored["metrics"], per_item=scored.get("per_item", {}),
                   failure_classes=scored.get("failure_classes", {}))
    outcome["artifacts"].update(scored.get("artifacts", {}))
    outcome["details"]["scoring"] = {**scored.get("details", {}), "nll_original_model": base_path}
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
    outcome["resources"]["total_params"] = sum(p.numel() for p in model.parameters()) + \
        outcome["resources"]["trainable_params"]
    metrics = dict(getattr(bundle.config, "metrics", {}) or {})
    outcome["gate_means"] = {"forget": metrics.get("forget_gate_mean"), "retain": metrics.get("retain_gate_mean"),
                             "raw": metrics}
    outcome["artifacts"]["routers"] = str(out)
    return str(out)


def _corpus_rows(source: str, data_dir) -> list[dict]:
    """Rows (question/answer or text) of a corpus source, as `cru_harness.data.load_corpus_rows` reads them."""
    from ..data.corpora import load_corpus_rows

    return load_corpus_rows(source, data_dir)[0]


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


def retain_from_per_item(path: str, forget_task: str | None = None) -> dict:
    """A retain model given as a saved per-item file: its forget truth ratios (and questions, to match items)
    feed Forget Quality. `.json`: a cell result (or its `per_item`); else a `per_item.jsonl` written by `score`."""
    import json

    values, questions = [], []
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"retain per-item file not found: {path}")
    if file.suffix == ".json":
        data = read_json(file)
        per_item = data.get("per_item", data)
        values = per_item.get("forget_truth_ratio", [])
        questions = per_item.get("forget_question") or []
    else:
        for line_no, line in enumerate(file.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            task = row.get("task", "")
            if (task == forget_task if forget_task else task.startswith("tofu_forget")) and \
                    row.get("truth_ratio") is not None:
                if "question" not in row:
                    raise ValueError(f"{path}:{line_no}: a forget row without its question")
                values.append(row["truth_ratio"])
                questions.append(row["question"])
    if not values:
        raise ValueError(f"{path} holds no forget-set truth ratios for {forget_task or 'tofu_forget*'} "
                         f"(field forget_truth_ratio / truth_ratio)")
    per_item = {"forget_truth_ratio": values}
    if questions and len(questions) == len(values):
        per_item["forget_question"] = questions
    return {"per_item": per_item, "details": {"retain_source": str(path)}}




def use_chat_template(cell: Cell, model_path: str) -> bool:
    """Whether the cell's prompts go through the model's chat template (see `model_uses_chat_template`)."""
    return model_uses_chat_template(cell.model, cell.evaluation, model_path)


def model_uses_chat_template(model: ModelSpec, evaluation: dict, model_path: str) -> bool:
    """Whether a model's prompts go through its chat template (protocol: a model with one gets it).

    Order: the model's `chat_template` setting, then `evaluation.apply_chat_template`, then automatic: testbed
    checkpoints (`zoo:`) are fine-tuned on the plain `Question: ...\nAnswer:` template (their tokenizer's chat
    template exists to exercise chat code paths), so they are evaluated plain; any other model uses its chat
    template when its tokenizer has one.
    """
    if model.chat_template is not None:
        return bool(model.chat_template)
    if evaluation.get("apply_chat_template") is not None:
        return bool(evaluation["apply_chat_template"])
    if model.path.startswith("zoo:"):
        return False
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=model.trust_remote_code)
    return bool(getattr(tokenizer, "chat_template", None))


def evaluate_cell(cell: Cell, model_path: str, routers: str | None, workdir: Path, data_dir,
                  chat_template: bool) -> dict:
    """lm-eval `simple_evaluate` with the `cru` model on the cell's tasks; its outputs are saved under
    workdir/lmeval exactly as `lm_eval --output_path ... --log_samples` saves them (what the scorers read)."""
    gen_kwargs = None
    if cell.evaluation.get("max_gen_toks"):
        gen_kwargs = {"max_gen_toks": int(cell.evaluation["max_gen_toks"])}
    out = workdir / "lmeval"
    tasks, unavailable = rwku_tasks_with_data(cell, data_dir)
    t0 = time.perf_counter()
    run_lmeval(cell.model, model_path, tasks, out, routers=routers, data_dir=data_dir,
               targets=None if cell.target is None else str(cell.target), limit=cell.limit,
               batch_size=cell.evaluation.get("batch_size", 8), device=_device(cell), chat_template=chat_template,
               gen_kwargs=gen_kwargs)
    return {"output_dir": out, "wall_time_s": time.perf_counter() - t0, "artifacts": {"lmeval": str(out)},
            "tasks_unavailable": unavailable}


def rwku_tasks_with_data(cell: Cell, data_dir) -> tuple[list[str], dict[str, str]]:
    """The cell's tasks minus RWKU utility tasks its target has no data for, with the reason for each one left out.

    RWKU ships its utility sets (MMLU, BBH, TruthfulQA, TriviaQA, fluency) for targets 1-10 only. A cell of
    another target keeps its forget, neighbour and MIA probes and records utility as unavailable, instead of
    failing as a whole. A utility file that does not load for a target that should have one (1-10, or a copy
    that ships more) stays in: its error then surfaces in the evaluation, never hidden here.
    """
    if cell.benchmark != "rwku" or cell.target is None:
        return list(cell.tasks), {}
    from ..data.rwku import UTILITY_TARGETS, load_target_file
    from ..tasks.rwku.utils import PROBE_KINDS, UTILITY_PROBES

    kept, dropped = [], {}
    for task in cell.tasks:
        name = task.removeprefix("rwku_icu_").removeprefix("rwku_")
        if not name.startswith("utility") or cell.target in UTILITY_TARGETS:
            kept.append(task)
            continue
        probe = name.removeprefix("utility").lstrip("_")
        kinds = [kind for p in ([probe] if probe else UTILITY_PROBES) for kind in PROBE_KINDS[p]]
        missing = []
        for kind in kinds:
            try:
                load_target_file(cell.target, kind, data_dir)
            except Exception:  # noqa: BLE001 - any failure here means: no such set for this target
                missing.append(kind)
        if missing:
            dropped[task] = (f"RWKU has no {', '.join(missing)} for target {cell.target} "
                             "(its utility sets exist for targets 1-10 only)")
        else:
            kept.append(task)
    if not kept:
        raise ValueError(f"no task of {list(cell.tasks)} has data for RWKU target {cell.target}: {dropped}")
    return kept, dropped


def eval_model_args(model: ModelSpec, model_path: str, routers: str | None = None) -> dict[str, Any]:
    """`--model cru` arguments for a model spec. Scoring in bf16/fp16 keeps the log-softmax in float32:
    lm-eval computes it in the model's dtype by default, which rounds log-probs to a few bits (-5.875)."""
    dtype = model.eval_dtype or model.dtype
    args: dict[str, Any] = {"pretrained": model_path, "dtype": dtype}
    if dtype in ("bfloat16", "float16", "auto"):
        args["softmax_dtype"] = "float32"
    if routers:
        args["routers"] = routers
    if model.trust_remote_code:
        args["trust_remote_code"] = True
    return args


def run_lmeval(model: ModelSpec, model_path: str, tasks: list[str], out: Path, *, routers: str | None = None,
               data_dir=None, targets: str | None = None, limit: int | None = None, batch_size=8,
               device: str = "cpu", chat_template: bool = False, gen_kwargs: dict | None = None) -> dict:
    """One `simple_evaluate` on the project's tasks, saved under `out` as `lm_eval --log_samples` saves it.
    `targets`: RWKU targets (lm-eval metadata `rwku_targets`); `limit` on RWKU = rows per file and target."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from ..lmeval.registration import register, tasks_dir

    register()
    # The tasks read their data and targets from lm-eval's metadata; it must go to the TaskManager (simple_evaluate's
    # own `metadata=` is only used when it builds the TaskManager itself).
    metadata: dict[str, Any] = {}
    if targets is not None:
        metadata["rwku_targets"] = targets
    if data_dir:
        metadata["data_dir"] = str(data_dir)
    if targets is not None and limit is not None:
        # RWKU: the first N rows of each file kind of the target (MIA: N members + N non-members); lm-eval's
        # `limit` would keep the first N docs only, i.e. MIA members without any non-member (no AUC).
        metadata["rwku_items_per_target"] = int(limit)
        limit = None
    tracker = EvaluationTracker(output_path=str(out))
    results = lm_eval.simple_evaluate(
        model="cru", model_args=eval_model_args(model, model_path, routers), tasks=tasks, limit=limit,
        batch_size=batch_size, device=device, log_samples=True,
        task_manager=TaskManager(include_path=tasks_dir(), include_defaults=False, metadata=metadata or None),
        system_instruction=SYSTEM_INSTRUCTION if chat_template else None,
        apply_chat_template=chat_template, gen_kwargs=gen_kwargs, evaluation_tracker=tracker,
        bootstrap_iters=0,
    )
    if results is None:
        raise RuntimeError(f"lm-eval returned no results for tasks {tasks}")
    samples = results.pop("samples", {}) or {}
    tracker.save_results_aggregated(results=results, samples=samples)
    for task in results.get("configs", {}):
        if task in samples:
            tracker.save_results_samples(task_name=task, samples=samples[task])
    results["samples"] = samples
    return results


# --------------------------------------------------------------------------------------------------- scoring
def score_cell(cell: Cell, lmeval_dir: Path, *, data_dir=None, original_model: str | None = None,
               retain_result: dict | None = None) -> dict:
    """Per-cell numbers in the result schema (docs/results_schema.md) from the cell's saved lm-eval outputs,
    through the project scorers (`reporting.cell_scores`: `reporting.score` for TOFU, the RWKU tasks'
    `per_target_results` for RWKU, `reporting.failure_modes` for answer classes)."""
    from ..reporting import cell_scores

    failure = bool(cell.evaluation.get("failure_classes", True))
    original = original_model if failure else None
    batch_size = int(cell.evaluation.get("batch_size", 8))
    if cell.benchmark == "tofu":
        forget_task = f"tofu_{cell.split}"
        retain_items = cell_scores.retain_items_from_result(retain_result, forget_task) if retain_result else None
        scored = cell_scores.score_tofu_cell(lmeval_dir, split=cell.split, retain_items=retain_items,
                                             original_model=original, data_dir=data_dir, device=_device(cell),
                                             batch_size=batch_size)
    else:
        scored = cell_scores.score_rwku_cell(lmeval_dir, target=cell.target, original_model=original,
                                             device=_device(cell), batch_size=batch_size)
    if not failure:
        scored["failure_classes"] = {}
    return scored
