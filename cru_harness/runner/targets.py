"""RWKU targets the model knows: `benchmarks.rwku.select_known` picks them before any cell is planned.

Unlearning a target the model never knew measures nothing (every method "forgets" it for free), so a config
can name candidate targets and keep the `top` ones the *original* model knows best: its mean RWKU ROUGE-L
recall on the forget `probes` (default FB and QA) over the first `rows` rows of each candidate. The score is
the protocol's own metric, computed by the same lm-eval tasks the cells run, with the same prompting.

The selection is made once per (model, selection spec, candidates, data) and saved atomically in the run
directory (`target_selection/<model>.json`, with every candidate's score), so a resumed or re-run config
reuses it and the report can show why these targets were chosen. Ties keep the lower target index.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ..reporting.targets import SELECTION_DIR, rank_targets  # noqa: F401  (importable here)
from .config import ExperimentConfig, ModelSpec

SELECTION_SCHEMA = 1
KNOWLEDGE_METRIC = "rouge_l_recall"


def selecting_benchmark(config: ExperimentConfig) -> str | None:
    """The configured benchmark whose units are chosen at run time (its block has `select_known`: RWKU's), or
    None."""
    return next((name for name, block in config.benchmarks.items() if block.get("select_known")), None)


def selection_key(config: ExperimentConfig, model: ModelSpec) -> dict[str, Any]:
    """Everything that determines the selection of one model (its hash invalidates a stale saved file), the
    code version included: a selection made by other code is made again (as cells are recomputed)."""
    from .prompting import lmeval_settings
    from .provenance import code_version

    spec = config.benchmarks[selecting_benchmark(config)]
    return {"schema": SELECTION_SCHEMA, "code_version": code_version(), "model": model.identity(),
            "candidates": spec["targets"],
            "select_known": spec["select_known"], "data_dir": spec["data_dir"],
            "batch_size": config.evaluation.get("batch_size", 8),
            "apply_chat_template": config.evaluation.get("apply_chat_template"),
            "lmeval_settings": lmeval_settings(config.evaluation)}


def selection_path(config: ExperimentConfig, model: ModelSpec) -> Path:
    return Path(config.output_dir) / SELECTION_DIR / f"{model.name}.json"


def _key_hash(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_selection(config: ExperimentConfig, model: ModelSpec, *, any_code: bool = False) -> dict | None:
    """The saved selection of this model, if it was made with the same key; else None. `any_code`: a selection
    made by other code counts too (reading finished results, e.g. `study --table-only`, never making new ones)."""
    path = selection_path(config, model)
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # a corrupt file is recomputed, never trusted
    key = selection_key(config, model)
    if any_code:
        return saved if _same_rule(saved.get("key") or {}, key) else None
    return saved if saved.get("key_hash") == _key_hash(key) else None


def _same_rule(saved: dict, key: dict) -> bool:
    """Whether a selection saved by other code was made by the same rule as `key` would make it now. A key
    written before `lmeval_settings` was recorded was made with the default ones (no generation override, the
    default presets): the only ones that code passed."""
    from .prompting import lmeval_settings

    def comparable(k: dict) -> dict:
        return {**k, "code_version": None, "lmeval_settings": k.get("lmeval_settings", lmeval_settings({}))}

    return json.loads(json.dumps(comparable(saved), default=str)) == \
        json.loads(json.dumps(comparable(key), default=str))


def knowledge_scores(per_target: dict[str, dict[int, dict]], probes: list[str],
                     candidates: list[int]) -> dict[int, dict[str, float]]:
    """Per candidate: each probe's ROUGE-L recall and their mean (`score`). A candidate missing from a probe's
    results is an error: it would silently rank last."""
    out: dict[int, dict[str, float]] = {}
    for target in candidates:
        row: dict[str, float] = {}
        for probe in probes:
            values = per_target.get(probe, {}).get(target)
            if values is None or values.get(KNOWLEDGE_METRIC) is None:
                raise RuntimeError(f"target selection: {probe} returned no {KNOWLEDGE_METRIC} for target {target}")
            row[probe] = float(values[KNOWLEDGE_METRIC])
        row["score"] = sum(row[p] for p in probes) / len(probes)
        out[target] = row
    return out


def select_known_targets(config: ExperimentConfig, model: ModelSpec, *, log: Callable[[str], None] = print,
                         evaluate=None) -> dict:
    """Choose (or reuse) the RWKU targets `model` knows best; returns the saved selection record.

    `evaluate(model, model_path, tasks, out, targets=..., limit=..., ...)`: lm-eval run (default: the
    runner's `run_lmeval`); tests inject a fake one.
    """
    saved = load_selection(config, model)
    if saved is not None:
        log(f"target selection for {model.name}: reusing {selection_path(config, model)} -> {saved['chosen']}")
        return saved
    from tqdm.auto import tqdm

    from .. import plugins
    from ..store import atomic_write_json, now_iso
    from .evaluation import run_lmeval
    from .prompting import model_uses_chat_template
    from .models import resolve_data_dir, resolve_device, resolve_model_path

    spec = config.benchmarks[selecting_benchmark(config)]
    select = spec["select_known"]
    candidates = list(spec["targets"])
    evaluate = evaluate or run_lmeval
    model_path = resolve_model_path(model.path)
    chat = model_uses_chat_template(model, config.evaluation, model_path)
    key = selection_key(config, model)   # what the record says it was made with is what the run is given
    log(f"target selection for {model.name}: scoring the original model on {', '.join(select['probes'])} for "
        f"{len(candidates)} candidate targets ({select['rows'] or 'all'} rows each), keeping the top {select['top']}")
    t0 = time.perf_counter()
    per_target: dict[str, dict[int, dict]] = {}
    # One lm-eval run per candidate, as RWKU's own evaluation scores each target alone: the bar then counts
    # targets (this step takes most of a small run's time), and a target's rows are batched only with its own.
    with tempfile.TemporaryDirectory(prefix="cru_target_selection_") as tmp, \
            tqdm(candidates, desc=f"choosing RWKU targets ({model.name})", unit="target") as bar:
        for target in bar:
            bar.set_postfix_str(f"target {target}")
            with quiet_lmeval():   # the bar counts targets; lm-eval's own bars, one per pass, buried it
                results = evaluate(model, model_path, list(select["probes"]), Path(tmp) / f"lmeval_{target}",
                                   data_dir=resolve_data_dir(spec["data_dir"]), targets=str(target),
                                   limit=select["rows"], batch_size=config.evaluation.get("batch_size", 8),
                                   device=resolve_device(config.device), chat_template=chat,
                                   **key["lmeval_settings"])
            for probe, rows in plugins.benchmarks.get(selecting_benchmark(config)).per_unit_results(
                    results.get("samples") or {}).items():
                per_target.setdefault(probe, {}).update(rows)
    scores = knowledge_scores(per_target, select["probes"], candidates)
    chosen = rank_targets({t: row["score"] for t, row in scores.items()}, select["top"])
    names = {t: row.get("target_name", "") for probe in select["probes"]
             for t, row in per_target.get(probe, {}).items()}
    record = {"schema": SELECTION_SCHEMA, "key_hash": _key_hash(key), "key": key, "model": model.name,
              "chosen": chosen, "metric": f"mean {KNOWLEDGE_METRIC} of {', '.join(select['probes'])} "
                                          f"(original model, first {select['rows'] or 'all'} rows per file)",
              "scores": {str(t): {**row, "target_name": names.get(t, "")} for t, row in scores.items()},
              "wall_time_s": time.perf_counter() - t0, "created": now_iso()}
    atomic_write_json(selection_path(config, model), record)
    log(f"target selection for {model.name}: chose {chosen} in {record['wall_time_s']:.0f}s "
        "(" + ", ".join(f"{t} {names.get(t, '')}: {scores[t]['score']:.3f}" for t in chosen) + ")")
    return record


@contextlib.contextmanager
def quiet_lmeval():
    """Holds back what one lm-eval pass writes to stderr (its progress bars, its INFO lines) so that the target bar
    stays readable; written out after all when the pass fails, beside its error."""
    held = io.StringIO()
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        with contextlib.redirect_stderr(held):
            yield
    except BaseException:
        sys.stderr.write(held.getvalue()[-20000:])
        raise
    finally:
        logger.setLevel(level)


def resolve_selected_targets(config: ExperimentConfig, *, run: bool, log: Callable[[str], None] = print,
                             evaluate=None, any_code: bool = False) -> dict[str, list[int]]:
    """Model name -> chosen RWKU targets, for every model whose RWKU targets come from `select_known`.
    `run=False` (dry run): only saved selections are used; models without one are left out (planned later);
    with `any_code`, saved selections made by other code are used too (see `load_selection`)."""
    bench = selecting_benchmark(config)
    if bench is None:
        return {}
    chosen: dict[str, list[int]] = {}
    for model in config.models:
        if bench not in model.benchmarks:
            continue
        record = (select_known_targets(config, model, log=log, evaluate=evaluate) if run
                  else load_selection(config, model, any_code=any_code))
        if record is not None:
            chosen[model.name] = list(record["chosen"])
    return chosen
