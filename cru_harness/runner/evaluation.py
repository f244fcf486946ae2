"""The evaluation phase of a cell: lm-eval's `simple_evaluate` with the `cru` model on the project's tasks, saved
as `lm_eval --log_samples` saves it, then scored through the project scorers (`scoring.cell_scores`)."""
from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from ..devices import HALF_DTYPES, explain_out_of_memory
from .config import ModelSpec
from .models import model_dtype
from .plan import Cell
from .prompting import protocol_presets

#: What a scoring pass too large for the GPU is told to change.
SMALLER_EVALUATION = "lower evaluation.batch_size in the config (it changes no setting of the protocol)"


def evaluate_cell(cell: Cell, model_path: str, routers: str | None, workdir: Path, data_dir,
                  chat_template: bool, reference: str | None = None, metadata: dict | None = None,
                  tasks: tuple[list[str], dict[str, str]] | None = None) -> dict:
    """lm-eval `simple_evaluate` with the `cru` model on the cell's tasks; its outputs are saved under
    workdir/lmeval exactly as `lm_eval --output_path ... --log_samples` saves them (what the scorers read).
    `metadata`: more lm-eval metadata for the tasks (an attack's `task_metadata`). `tasks`: the tasks its data
    serves and why each other one is left out, when the executor found them already (`tasks_with_data`)."""
    tasks, unavailable = tasks if tasks is not None else tasks_with_data(cell, data_dir)
    # presets, generation settings, task and model metadata and device, as the plan settled them
    decisions = cell.decisions
    out = workdir / "lmeval"
    t0 = time.perf_counter()
    run_lmeval(cell.model, model_path, tasks, out, routers=routers, reference=reference, data_dir=data_dir,
               benchmark=cell.benchmark, limit=cell.limit,
               batch_size=cell.evaluation.get("batch_size", 8), device=decisions.device, chat_template=chat_template,
               metadata={**decisions.task_metadata, **decisions.model_metadata, **(metadata or {})},
               **decisions.lmeval_settings)
    return {"output_dir": out, "wall_time_s": time.perf_counter() - t0, "artifacts": {"lmeval": str(out)},
            "tasks_unavailable": unavailable}


def tasks_with_data(cell: Cell, data_dir) -> tuple[list[str], dict[str, str]]:
    """The cell's tasks its benchmark's data can serve (`Benchmark.tasks_with_data`: RWKU's utility sets exist for
    some targets only), with the reason for each one left out."""
    from .. import plugins

    return plugins.benchmarks.get(cell.benchmark).tasks_with_data(cell, data_dir)


def eval_model_args(model: ModelSpec, model_path: str, routers: str | None = None,
                    reference: str | None = None) -> dict[str, Any]:
    """`--model cru` arguments for a model spec, in its scoring dtype (`models.model_dtype`: `auto` is the
    model's own checkpoint's, whatever dtype `model_path` was saved in). Scoring in bf16/fp16 keeps the
    log-softmax in float32: lm-eval computes it in the model's dtype by default, which rounds log-probs to a few
    bits (-5.875)."""
    dtype = model_dtype(model, "eval")
    args: dict[str, Any] = {"pretrained": model_path, "dtype": dtype}
    adapter = Path(model_path) / "adapter_config.json"
    if adapter.is_file():   # a LoRA cell's PEFT adapter: lm-eval loads the base it names, then the adapter
        args.update(pretrained=json.loads(adapter.read_text())["base_model_name_or_path"], peft=model_path)
    if dtype in HALF_DTYPES:
        args["softmax_dtype"] = "float32"
    if model.device_map == "auto":
        args["parallelize"] = True  # lm-eval's HF loader: device_map="auto" over the visible GPUs
    if routers:
        args["routers"] = routers
    if reference:
        args["reference"] = reference   # the TOFU privacy tasks' reference attack
    if model.trust_remote_code:
        args["trust_remote_code"] = True
    return args


def run_lmeval(model: ModelSpec, model_path: str, tasks: list[str], out: Path, *, routers: str | None = None,
               reference: str | None = None, data_dir=None, targets: str | None = None, limit: int | None = None, batch_size=8,
               device: str = "cpu", chat_template: bool = False, gen_kwargs: dict | None = None,
               presets: dict | None = None, metadata: dict | None = None, benchmark: str | None = None) -> dict:
    """One `simple_evaluate` on the benchmarks' tasks, saved under `out` as `lm_eval --log_samples` saves it.
    `benchmark`: whose tasks (its `lmeval_limit` turns `limit` into what its tasks read); `targets`: the numbered
    units to evaluate (`Benchmark.task_metadata`; the benchmark whose unit is a target when none is named);
    `presets`: `protocol_presets(...)` (default: the default presets); `metadata`: a benchmark's own keys
    (`Benchmark.task_metadata`)."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from .. import plugins
    from ..lmeval.registration import register, task_paths

    register()
    # The tasks read their data and targets from lm-eval's metadata; it must go to the TaskManager (simple_evaluate's
    # own `metadata=` is only used when it builds the TaskManager itself).
    metadata = {k: v for k, v in {**(presets or protocol_presets({})), **(metadata or {})}.items() if v is not None}
    if benchmark is None and targets is not None:
        benchmark = next(plugin.name for plugin in plugins.benchmarks if plugin.unit == "target")
    plugin = plugins.benchmarks.get(benchmark) if benchmark is not None else None
    if plugin is not None and targets is not None:
        metadata.update(plugin.task_metadata(None, targets))
    if data_dir:
        metadata["data_dir"] = str(data_dir)
    if plugin is not None:
        limit, per_unit = plugin.lmeval_limit(limit)   # e.g. rows per file and target instead of lm-eval's first N
        metadata.update(per_unit)
    tracker = EvaluationTracker(output_path=str(out))
    from ..fingerprints import quiet_lm_eval_git

    # a benchmark whose tasks are lm-eval's own names their folders, and may point them at a local copy
    handed = plugin.lmeval_tasks(list(tasks), data_dir) if plugin is not None else nullcontext(([], list(tasks)))
    with handed as (extra_paths, specs), quiet_lm_eval_git(), \
            explain_out_of_memory(f"lm-eval at batch size {batch_size}", SMALLER_EVALUATION):
        results = lm_eval.simple_evaluate(
            model="cru", model_args=eval_model_args(model, model_path, routers, reference), tasks=specs, limit=limit,
            batch_size=batch_size, device=device, log_samples=True,
            task_manager=TaskManager(include_path=[*task_paths(), *extra_paths], include_defaults=False,
                                     metadata=metadata or None),
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


def score_cell(cell: Cell, lmeval_dir: Path, *, data_dir=None, original_model: str | None = None,
               retain_result: dict | None = None) -> dict:
    """Per-cell numbers in the result schema (docs/results_schema.md) from the cell's saved lm-eval outputs,
    through the project scorers (`scoring.cell_scores`: TOFU's `benchmarks/tofu/score.py`, the RWKU tasks'
    `per_target_results` for RWKU, `scoring.failure_modes` for answer classes), by the cell's benchmark plugin."""
    from .. import plugins

    failure = bool(cell.evaluation.get("failure_classes", True))
    original = original_model if failure else None
    decisions = cell.decisions
    batch_size = int(cell.evaluation.get("batch_size", 8))
    # the original model scores the answers for the failure classes
    with explain_out_of_memory(f"failure classes at batch size {batch_size}", SMALLER_EVALUATION):
        scored = plugins.benchmarks.get(cell.benchmark).score(
            cell, lmeval_dir, data_dir=data_dir, original_model=original, retain_result=retain_result,
            device=decisions.device, batch_size=batch_size)
    if not failure:
        scored["failure_classes"] = {}
    return scored


def logit_lens_of_cell(cell: Cell, model_path: str, routers: str | None, data_dir, chat: bool,
                       exclude: list[str] | None = None) -> dict | None:
    """The logit lens (`attacks.logit_lens`) on the cell's model as it was scored (its routers attached, its
    scoring dtype, its prompt format), over its benchmark's forget items (`Benchmark.lens_rows`) less those whose
    question is in `exclude` (the items a relearn attack trained on): per decoder block the forget probability
    read through the final norm and head, and the best block. None when the benchmark has no forget probability
    (RWKU)."""
    import gc

    from .. import plugins
    from ..attacks.logit_lens import logit_lens_scores

    decisions = cell.decisions
    found = plugins.benchmarks.get(cell.benchmark).lens_rows(cell, data_dir)
    if found is None:
        return None
    rows, source = found
    if exclude:
        left_out = set(exclude)
        kept = [row for row in rows if row.get("question") not in left_out]
        if not kept:
            return {"skipped": "the attack trained on every forget item: none is left to read"}
        source = f"{source}, less the {len(rows) - len(kept)} items the attack trained on"
        rows = kept
    model, tokenizer = decisions.load_model(model_path, dtype=decisions.dtype("eval"))
    try:
        result = logit_lens_scores(model, tokenizer, rows, routers=routers, prompt_format=decisions.rows(chat))
    finally:
        del model
        gc.collect()
    return {**result.to_dict(), "rows": source, "routers": routers}


def cell_lens(cell: Cell, model_path: str, routers: str | None, data_dir, chat: bool,
              served_by: dict | None, taught: list[str] | None = None) -> dict | None:
    """The logit lens a cell records: read on its model (`logit_lens_of_cell`) over the forget items it was not
    trained on (`taught`: a relearn attack's slice, left out as its recovery leaves them out); that of
    `served_by`, the attacked cell whose model a prompt attack serves unchanged; or why there is none (a model of
    several checkpoints, WHP's). None: the benchmark has no forget probability."""
    # the oracle and Original (attacked too) are one checkpoint; a method says whether its model is
    method = cell.decisions.method
    if method is not None and not method.one_checkpoint:
        return {"skipped": f"a {cell.method} model combines two models' output logits: no one stack of layers to read"}
    seen = ((served_by or {}).get("details") or {}).get("logit_lens")
    if seen:
        return {**seen, "from_attacked_cell": cell.extra["attacked"]}
    # a prompt attack's shown pairs are not in the weights: only a model trained on forget items leaves some out
    return logit_lens_of_cell(cell, model_path, routers, data_dir, chat,
                              exclude=taught if served_by is None else None)
