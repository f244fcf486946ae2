"""The evaluation phase of a cell: lm-eval's `simple_evaluate` with the `cru` model on the project's tasks, saved
as `lm_eval --log_samples` saves it, then scored through the project scorers (`scoring.cell_scores`)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..devices import HALF_DTYPES, explain_out_of_memory
from ..errors import InputError
from .config import ModelSpec
from .models import cell_device, model_dtype
from .plan import Cell

#: What a scoring pass too large for the GPU is told to change.
SMALLER_EVALUATION = "lower evaluation.batch_size in the config (it changes no setting of the protocol)"


def preset_defaults(evaluation: dict) -> dict[str, Any]:
    """The evaluation keys that are protocol presets / options of the tasks (lm-eval metadata of the same name),
    with their defaults: of each benchmark whose defaults are in every cell, or whose keys `evaluation` sets."""
    from .. import plugins

    defaults: dict[str, Any] = {}
    for plugin in plugins.benchmarks:
        if plugin.evaluation_in_every_cell or set(plugin.evaluation_defaults) & set(evaluation):
            defaults.update({key: value for key, value in plugin.evaluation_defaults.items()
                             if key in plugin.metadata_keys})
    return defaults


def __getattr__(name: str):
    """`PRESET_KEYS`: the keys of `preset_defaults({})`, read from the registry when used."""
    if name == "PRESET_KEYS":
        return tuple(preset_defaults({}))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def protocol_presets(evaluation: dict) -> dict[str, Any]:
    """The presets a run uses (defaults filled in): passed to the tasks as lm-eval metadata and recorded in every
    cell's `details.prompting`. System prompts are the tasks' own (TOFU open-unlearning: "You are a helpful
    assistant."; RWKU: none), so the runner passes no `system_instruction`."""
    return {key: evaluation.get(key, default) if evaluation.get(key) is not None else default
            for key, default in preset_defaults(evaluation).items()}


def lmeval_settings(evaluation: dict) -> dict[str, Any]:
    """The generation and preset arguments of `run_lmeval` that the config's `evaluation` block decides: one
    place, so that RWKU target selection answers the probes exactly as the cells do."""
    gen_kwargs = {"max_gen_toks": int(evaluation["max_gen_toks"])} if evaluation.get("max_gen_toks") else None
    return {"gen_kwargs": gen_kwargs, "presets": protocol_presets(evaluation)}


def use_chat_template(cell: Cell, model_path: str) -> bool:
    """Whether the cell's prompts go through the model's chat template (see `model_uses_chat_template`). Never for
    a TOFU cell whose preset and `tofu_model_family` fix the text format (legacy, or an open-unlearning model
    config without a chat template): the reference writes those prompts itself."""
    from .. import plugins

    if plugins.benchmarks.get(cell.benchmark).fixed_prompt_format(protocol_presets(cell.evaluation)):
        return False
    return model_uses_chat_template(cell.model, cell.evaluation, model_path)


def model_uses_chat_template(model: ModelSpec, evaluation: dict, model_path: str) -> bool:
    """Whether a model's prompts go through its chat template (protocol: a model with one gets it).

    Order: the model's `chat_template` setting, then `evaluation.apply_chat_template`, then automatic: testbed
    checkpoints (`zoo:`) are fine-tuned on the plain `Question: ...\nAnswer:` template (their tokenizer's chat
    template exists to exercise chat code paths), so they are evaluated plain; any other model uses its chat
    template when its tokenizer has one. A cell's TOFU prompts may still be fixed by its preset: `use_chat_template`.
    """
    if model.chat_template is not None:
        return bool(model.chat_template)
    if evaluation.get("apply_chat_template") is not None:
        return bool(evaluation["apply_chat_template"])
    from ..testbed.names import trained_plain

    if trained_plain(model.path):
        return False
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=model.trust_remote_code)
    return bool(getattr(tokenizer, "chat_template", None))


def evaluate_cell(cell: Cell, model_path: str, routers: str | None, workdir: Path, data_dir,
                  chat_template: bool, reference: str | None = None, metadata: dict | None = None) -> dict:
    """lm-eval `simple_evaluate` with the `cru` model on the cell's tasks; its outputs are saved under
    workdir/lmeval exactly as `lm_eval --output_path ... --log_samples` saves them (what the scorers read).
    `metadata`: more lm-eval metadata for the tasks (an attack's `task_metadata`)."""
    out = workdir / "lmeval"
    from .. import plugins

    tasks, unavailable = tasks_with_data(cell, data_dir)
    t0 = time.perf_counter()
    run_lmeval(cell.model, model_path, tasks, out, routers=routers, reference=reference, data_dir=data_dir,
               benchmark=cell.benchmark, limit=cell.limit,
               batch_size=cell.evaluation.get("batch_size", 8), device=cell_device(cell), chat_template=chat_template,
               metadata={**plugins.benchmarks.get(cell.benchmark).task_metadata(cell.split, cell.target),
                         **(metadata or {})},
               **lmeval_settings(cell.evaluation))
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

    with explain_out_of_memory(f"lm-eval at batch size {batch_size}", SMALLER_EVALUATION), quiet_lm_eval_git():
        results = lm_eval.simple_evaluate(
            model="cru", model_args=eval_model_args(model, model_path, routers, reference), tasks=tasks, limit=limit,
            batch_size=batch_size, device=device, log_samples=True,
            task_manager=TaskManager(include_path=task_paths(), include_defaults=False, metadata=metadata or None),
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
    through the project scorers (`scoring.cell_scores`: `scoring.score` for TOFU, the RWKU tasks'
    `per_target_results` for RWKU, `scoring.failure_modes` for answer classes), by the cell's benchmark plugin."""
    from .. import plugins

    failure = bool(cell.evaluation.get("failure_classes", True))
    original = original_model if failure else None
    batch_size = int(cell.evaluation.get("batch_size", 8))
    # the original model scores the answers for the failure classes
    with explain_out_of_memory(f"failure classes at batch size {batch_size}", SMALLER_EVALUATION):
        scored = plugins.benchmarks.get(cell.benchmark).score(
            cell, lmeval_dir, data_dir=data_dir, original_model=original, retain_result=retain_result,
            device=cell_device(cell), batch_size=batch_size)
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
    from .models import load_model
    from .training import prompt_format

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
    model, tokenizer = load_model(model_path, cell, dtype=model_dtype(cell.model, "eval"))
    try:
        result = logit_lens_scores(model, tokenizer, rows, routers=routers, prompt_format=prompt_format(cell, chat))
    finally:
        del model
        gc.collect()
    return {**result.to_dict(), "rows": source, "routers": routers}
