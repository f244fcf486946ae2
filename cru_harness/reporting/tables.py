"""Leaderboard tables (Markdown, CSV, LaTeX) laid out like the paper's: methods as rows, one block per
(model, split) on TOFU and per model on RWKU (means over targets), the original model as an unranked reference
row, the best method per column in bold (each column has its direction), failure classes beside ROUGE.
"""
from __future__ import annotations

import csv
import io
import statistics
from collections import defaultdict
from dataclasses import dataclass

from ..metrics.failure import ANSWER_CLASSES
from ..metrics.recovery import MIN_REPORTED_GAP, share_hidden_reason, share_shown, taught_questions
from . import stats
from .intervals import describe as intervals_describe
from .intervals import fmt_interval

FAILURE_CLASSES = ANSWER_CLASSES


@dataclass(frozen=True)
class Column:
    key: str
    header: str          # plain text (Markdown / CSV)
    latex: str
    direction: str | None  # "up", "down", "half" (closer to 0.5 is better), "zero" (closer to 0), None = not ranked
    group: str = ""
    optional: bool = False   # CSV lists it only when a row has it (a task a run may not have evaluated)


def fc_columns(where: str) -> list[Column]:
    """The failure-class columns of one answer set (`forget`: what answers on the forget set turned into)."""
    return [Column(f"fc_{where}_{name}", f"{where} {name[:3]}.", f"{name[:3].capitalize()}.", None,
                   f"{where.capitalize()} failure classes") for name in FAILURE_CLASSES]


def benchmark_view(benchmark: str | None):
    """The registered benchmark plugin whose columns, derived metrics and trade-off axes a table reads."""
    from .. import plugins

    return plugins.benchmarks.get(benchmark)


def columns_for(benchmark: str) -> list[Column]:
    return list(benchmark_view(benchmark).columns)


RESOURCE_KEYS = ("train_wall_time_s", "train_peak_memory_bytes", "cell_wall_time_s", "cell_peak_rss_bytes",
                 "trainable_params")


# ------------------------------------------------------------------------------------------------ derived values
def derived_metrics(result: dict) -> dict[str, float | None]:
    """The metrics of one cell plus the derived columns (1 - x, forget_all, failure-class fractions)."""
    metrics = dict(result.get("metrics") or {})
    view = benchmark_view(result.get("benchmark"))
    view.derive(metrics, result)
    for where, fractions in (result.get("failure_classes") or {}).items():
        for name in FAILURE_CLASSES:
            metrics[f"fc_{where}_{name}"] = (fractions or {}).get(name)
    metrics["forgetting"], metrics["utility"] = view.forgetting_utility(metrics)
    metrics["tradeoff"] = stats.tradeoff_score(metrics["forgetting"], metrics["utility"])
    return metrics


def forgetting_utility(benchmark: str | None, metrics: dict) -> tuple[float | None, float | None]:
    """The trade-off axes (see stats.py), as the benchmark defines them: TOFU (1 - forget ROUGE-L, MU); RWKU
    (1 - forget All, mean utility)."""
    return benchmark_view(benchmark).forgetting_utility(metrics)


def _with_oracle(results: list[dict]):
    """(cell, its retain cell or None) for each finished cell of a benchmark with an oracle, the oracle itself
    included (finetune cells are not scored): the retain cell of the same model and split among `results`."""
    oracle = {(r["model"], r["split"]): r for r in results if r.get("kind") == "retain" and r.get("status") == "ok"}
    for result in results:
        if benchmark_view(result.get("benchmark")).has_oracle and result.get("status") == "ok" and \
                result.get("kind") != "finetune":
            yield result, oracle.get((result["model"], result["split"]))


def fill_from_oracle(results: list[dict]) -> list[dict]:
    """What each cell of a benchmark with an oracle compares with it, as the report shows it
    (`Benchmark.compare_to_oracle`: TOFU's Forget Quality and privleak), against the oracle cell of the same model
    and unit among `results`: the number a cell records when scored beside the same oracle, filled for a cell scored
    before its oracle existed and replaced for one scored against another oracle."""
    for result, retain in _with_oracle(results):
        benchmark_view(result.get("benchmark")).compare_to_oracle(result, retain)
    return results


# ------------------------------------------------------------------------------------------------ aggregation
_VARIANT_KEYS = ("method", "model_path")   # beside `hparams`: what makes two cells of one label different runs
# ... and beside those, what the cell's record says it ran with (`resolved_config`, which its hash covers): the
# model's recipe, the corpora, tasks, limit and evaluation settings. Not locations: the data folder, a local
# PURGE copy, the model's path again (`model_path`).
_RECORDED_KEYS = ("model", "corpora", "tasks", "limit", "evaluation", "extra")
# An attack cell's `extra.attacked` (the attacked cell's hash) differs per seed: a link, not a setting.
_LOCATION_KEYS = ("model.path", "extra.purge_local_checkpoint", "extra.attacked")


def variant_settings(result: dict) -> dict:
    """The settings that make a cell's run what it is, flat (`evaluation.batch_size`, `model.finetune.data`):
    method, model path, hyperparameters, and what its record resolved (`_RECORDED_KEYS`). A setting that is
    unset (None, an empty dict, or absent, as in a record written before the key existed) is left out, so that
    absent and unset are one setting."""
    flat: dict = {}

    def add(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                add(f"{prefix}.{key}", inner)
        elif value is not None and prefix not in _LOCATION_KEYS:
            flat[prefix] = value

    for key in _VARIANT_KEYS:
        add(key, result.get(key))
    for key, value in (result.get("hparams") or {}).items():
        add(key, value)
    resolved = result.get("resolved_config") or {}
    for key in _RECORDED_KEYS:
        add(key, resolved.get(key))
    return flat


def split_label_variants(results: list[dict]) -> list[dict]:
    """Results whose label covers cells run under different settings on one split or target (a config edited
    between runs into one directory: a learning rate, an evaluation limit, a fine-tuning recipe changed) get
    labels naming the settings that differ, e.g. `NPO-scaled (learning_rate=1e-05)` or `GA (limit=4)`, so that
    no row, rank or plot averages two configurations. Settings that differ between splits (a method's per-split
    `overrides`, each split's corpora) are one configuration and keep the label."""
    import json

    def where(result: dict) -> tuple:
        return result.get("benchmark"), result.get("model"), result.get("unit"), result.get("label")

    settings = [variant_settings(result) for result in results]   # once per cell: its identity and its name
    identities = [json.dumps(setting, sort_keys=True, default=str) for setting in settings]
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for result, identity, setting in zip(results, identities, settings):
        groups[where(result)].setdefault(identity, setting)
    renamed: dict[tuple, str] = {}
    for (benchmark, model, unit, label), variants in groups.items():
        if len(variants) < 2:
            continue
        keys = sorted({k for s in variants.values() for k in s})
        differing = [k for k in keys if len({json.dumps(s.get(k), default=str) for s in variants.values()}) > 1]
        for identity, setting in variants.items():   # (identities differ, so some key does)
            named = ", ".join(f"{k}={_setting(setting.get(k))}" for k in differing)
            renamed[(benchmark, model, unit, label, identity)] = f"{label} ({named})"
    out = []
    for result, identity in zip(results, identities):
        key = (*where(result), identity)
        out.append(dict(result, label=renamed[key]) if key in renamed else result)
    return out


def _setting(value) -> str:
    return "unset" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def aggregate(results: list[dict], benchmark: str) -> list[dict]:
    """One row per (model, split-or-'targets', method label): means over seeds (and RWKU targets)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for result in results:
        if result.get("benchmark") != benchmark or result.get("kind") in ("retain", "finetune", "attack"):
            continue   # attack cells have a table of their own (`robustness_rows`)
        unit = benchmark_view(benchmark).row_unit(result)
        groups[(result["model"], unit, result["label"])].append(result)
    rows = []
    for (model, unit, label), members in groups.items():
        ok = [m for m in members if m.get("status") == "ok"]
        derived = [derived_metrics(m) for m in ok]
        keys = {k for d in derived for k in d}
        row = {"model": model, "unit": unit, "label": label, "method": members[0]["method"],
               "reference": members[0].get("kind") == "original", "n_cells": len(members), "n_ok": len(ok),
               "n_unavailable": sum(m.get("status") == "unavailable" for m in members),
               "n_failed": sum(m.get("status") == "failed" for m in members),
               "seeds": sorted({m.get("seed") for m in ok if m.get("seed") is not None}),
               "targets": sorted({m.get("target") for m in ok if m.get("target") is not None}),
               "metrics": {k: stats.finite_mean(d.get(k) for d in derived) for k in keys},
               "metrics_sd": seed_spread(ok, derived, keys),
               "resources": {k: stats.finite_mean((m.get("resources") or {}).get(k) for m in ok)
                             for k in RESOURCE_KEYS},
               "gate_means": _gate_means(ok),
               "reasons": sorted({m.get("reason") for m in members if m.get("reason")}),
               "partial": _partial_tasks(ok) + _partial_columns(ok, derived, columns_for(benchmark)),
               "refinetuned": refinetuned_notes(ok), "presets": _presets(ok, benchmark)}
        benchmark_view(benchmark).derive_mean(row["metrics"], row["metrics_sd"])
        rows.append(row)
    order = _method_order(results)
    rows.sort(key=lambda r: (r["model"], str(r["unit"]), not r["reference"], order.get(r["label"], 99), r["label"]))
    _mark_best(rows, columns_for(benchmark))
    _mark_pareto(rows)
    return rows


def _presets(results: list[dict], benchmark: str) -> list[str]:
    """The scoring presets the cells were scored with (`evaluation.<benchmark>_preset` of their records)."""
    key = benchmark_view(benchmark).preset_key
    if key is None:
        return []
    return sorted({str(((r.get("resolved_config") or {}).get("evaluation") or {}).get(key)) for r in results
                   if ((r.get("resolved_config") or {}).get("evaluation") or {}).get(key) is not None})


def preset_note(rows: list[dict], benchmark: str) -> str | None:
    """One line naming the scoring preset behind the table's numbers, or each preset's rows where they differ."""
    view = benchmark_view(benchmark)
    key = view.preset_key
    by_preset: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        for preset in row.get("presets") or ["not recorded"]:
            by_preset[preset].append(f"{row['label']} ({_unit_label(row)})")
    if key is None or not any(row.get("presets") for row in rows):
        return None   # cells whose records name no preset (made before the key existed): nothing to say
    if len(by_preset) == 1:
        return (f"Scored with the {view.name.upper()} preset `{next(iter(by_preset))}` (`evaluation.{key}`; what it "
                "reproduces: docs/protocol.md).")
    return (f"Scored with several {view.name.upper()} presets (`evaluation.{key}`; docs/protocol.md): " +
            "; ".join(f"`{preset}`: {', '.join(labels)}" for preset, labels in sorted(by_preset.items())) + ".")


def _tasks_unavailable(result: dict) -> dict:
    """The tasks a cell could not run, with why (`details.tasks_unavailable`)."""
    return (result.get("details") or {}).get("tasks_unavailable") or {}


def _partial_tasks(results: list[dict]) -> list[str]:
    """A note for tasks some cells of a row could not run (RWKU utility beyond target 10): their means cover fewer
    targets than the row's other columns."""
    notes = []
    for task in sorted({t for r in results for t in _tasks_unavailable(r)}):
        lacking = sorted({r.get("target") for r in results if task in _tasks_unavailable(r)})
        notes.append(f"{task}: no data for target(s) {', '.join(map(str, lacking))}, "
                     f"mean over {sum(task not in _tasks_unavailable(r) for r in results)} cell(s)")
    return notes


def _partial_columns(results: list[dict], derived: list[dict], columns: list[Column]) -> list[str]:
    """A note for each column whose mean covers fewer of the row's cells than the row has (a metric some cells
    lack): the mean is over the cells that have it, and the table says so rather than averaging silently. Cells
    with a task they could not run are noted by `_partial_tasks` instead (not twice)."""
    notes = []
    explained = [bool(_tasks_unavailable(r)) for r in results]
    for column in columns:
        n = sum(stats.is_number(d.get(column.key)) for d in derived)
        if 0 < n and any(not stats.is_number(d.get(column.key)) and not e for d, e in zip(derived, explained)):
            notes.append(f"{column.header}: mean over {n} of {len(derived)} cells")
    return notes


def refinetuned_notes(results: list[dict]) -> list[str]:
    """A note for cells that started from a fine-tuned checkpoint made again (the first was not on the machine
    that ran them: `runner.execute.PlanExecutor.finetuned_checkpoint`) whose weights are not the recorded ones:
    GPU kernels need not be bitwise deterministic, nor another CPU's (an AMD EPYC refit a checkpoint of an Intel
    machine with other last bits), so those cells started from a slightly other model."""
    n = sum(((r.get("details") or {}).get("finetuned_from") or {}).get("matches_recorded") is False for r in results)
    return [f"{n} cell(s) from a fine-tuning re-run whose weights differ from the recorded checkpoint's"] if n else []


def seed_spread(results: list[dict], derived: list[dict], keys) -> dict[str, float]:
    """Per metric, the sample sd (ddof 1) over seeds of the seed's mean (RWKU: its mean over targets first), where
    two or more seeds have a value; nothing for a row of one seed (or none: the reference)."""
    by_seed: dict = defaultdict(list)
    for result, values in zip(results, derived):
        if result.get("seed") is not None:
            by_seed[result["seed"]].append(values)
    spread = {}
    for key in keys:
        means = [stats.finite_mean(values.get(key) for values in group) for group in by_seed.values()]
        means = [m for m in means if m is not None]
        if len(means) >= 2:
            spread[key] = statistics.stdev(means)
    return spread


def _gate_means(results: list[dict]) -> dict | None:
    forget = stats.finite_mean((r.get("gate_means") or {}).get("forget") for r in results)
    retain = stats.finite_mean((r.get("gate_means") or {}).get("retain") for r in results)
    return {"forget": forget, "retain": retain} if forget is not None or retain is not None else None


def _method_order(results: list[dict]) -> dict[str, int]:
    order = {}
    for result in results:
        order.setdefault(result.get("label"), len(order))
    return order


def _block(rows: list[dict]) -> dict[tuple, list[dict]]:
    blocks = defaultdict(list)
    for row in rows:
        blocks[(row["model"], row["unit"])].append(row)
    return blocks


def _mark_best(rows: list[dict], columns: list[Column]) -> None:
    """row["best"] = set of column keys where the row is best in its block, compared as printed (two values that
    print the same are both bold, or neither); a column where every method prints the same has none; reference
    rows never."""
    for row in rows:
        row["best"] = set()
    for block in _block(rows).values():
        competitors = [r for r in block if not r["reference"]]
        for col in columns:
            if col.direction is None:
                continue
            values = [(r, r["metrics"].get(col.key)) for r in competitors]
            values = [(r, float(fmt(v, col.key))) for r, v in values if stats.is_number(v)]
            if len(values) < 2 or len({v for _, v in values}) == 1:
                continue
            def goodness(v):
                if col.direction == "zero":
                    return -abs(v)
                return v if col.direction == "up" else (-v if col.direction == "down" else -abs(v - 0.5))
            best = max(goodness(v) for _, v in values)
            for r, v in values:
                if goodness(v) == best:
                    r["best"].add(col.key)


def _mark_pareto(rows: list[dict]) -> None:
    for block in _block(rows).values():
        competitors = [r for r in block if not r["reference"]]
        flags = stats.pareto_dominated({r["label"]: (r["metrics"].get("forgetting"), r["metrics"].get("utility"))
                                        for r in competitors})
        for r in block:
            r["pareto"] = None if r["reference"] else (
                None if not (stats.is_number(r["metrics"].get("forgetting"))
                             and stats.is_number(r["metrics"].get("utility")))
                else not flags[r["label"]])


# ------------------------------------------------------------------------------------------------ rendering
def scientific(key: str, value: float) -> bool:
    """Whether a table writes `value` in scientific notation: a Forget Quality (a p-value) below 0.01, which fixed
    decimals would print as 0.00."""
    return key == "forget_quality" and 0 < value < 0.01


def fmt(value, key: str = "") -> str:
    if not stats.is_number(value):
        return "--"
    return f"{value:.1e}" if scientific(key, value) else f"{value:.2f}"


def _present_columns(rows: list[dict], columns: list[Column]) -> list[Column]:
    """Columns with at least one value (a run without failure classes does not print four empty columns)."""
    return [c for c in columns if any(stats.is_number(r["metrics"].get(c.key)) for r in rows)] or columns[:1]


def _unit_label(row: dict) -> str:
    if row["unit"] == "all targets":
        return f"{len(row['targets'])} targets" if row["targets"] else "targets"
    return str(row["unit"])


def _row_note(row: dict) -> str:
    notes = []
    if row["n_unavailable"]:
        notes.append(f"{row['n_unavailable']} unavailable")
    if row["n_failed"]:
        notes.append(f"{row['n_failed']} failed")
    notes.extend(row.get("partial", []))
    notes.extend(row.get("refinetuned", []))
    return "; ".join(notes)


def to_markdown(rows: list[dict], benchmark: str) -> str:
    columns = _present_columns(rows, columns_for(benchmark))
    header = ["Model", benchmark_view(benchmark).table_unit, "Method", *[c.header for c in columns],
              "Pareto", "n", "Note"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * len(columns) + ["---"] * 3) + "|"]
    for row in rows:
        cells = []
        for c in columns:
            text = fmt(row["metrics"].get(c.key), c.key)
            sd = row.get("metrics_sd", {}).get(c.key)
            cells.append((f"**{text}**" if c.key in row["best"] else text) + (f" ± {fmt(sd, c.key)}" if sd is not None
                                                                                else ""))
        label = f"{row['label']} (reference)" if row["reference"] else row["label"]
        pareto = "" if row["pareto"] is None else ("front" if row["pareto"] else "dominated")
        lines.append("| " + " | ".join([row["model"], _unit_label(row), label, *cells, pareto,
                                          str(row["n_ok"]), _row_note(row)]) + " |")
    if benchmark_view(benchmark).table_note:
        lines += ["", benchmark_view(benchmark).table_note]
    if any(row.get("metrics_sd") for row in rows):
        lines += ["", "Mean ± sample sd (ddof 1) over seeds (RWKU: of each seed's mean over targets); a row without ±"
                  " ran one seed. Bold, ranks and the Pareto column read the means."]
    if note := preset_note(rows, benchmark):
        lines += ["", note]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict], benchmark: str) -> str:
    present = {c.key for c in _present_columns(rows, columns_for(benchmark))}
    columns = [c for c in columns_for(benchmark) if not c.optional or c.key in present]
    extra = ["forgetting", "utility", "tradeoff"]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["model", "unit", "method", "label", "reference", *[c.key for c in columns], *extra, "pareto_front",
                     "best_in", "n_ok", "n_unavailable", "n_failed", *RESOURCE_KEYS, "seeds",
                     *[f"{c.key}_sd" for c in columns]])
    for row in rows:
        values = [row["metrics"].get(c.key) for c in columns] + [row["metrics"].get(k) for k in extra]
        writer.writerow([row["model"], row["unit"], row["method"], row["label"], int(row["reference"]),
                         *["" if not stats.is_number(v) else repr(float(v)) for v in values],
                         "" if row["pareto"] is None else int(row["pareto"]), ";".join(sorted(row["best"])),
                         row["n_ok"], row["n_unavailable"], row["n_failed"],
                         *["" if not stats.is_number(row["resources"].get(k)) else row["resources"][k]
                           for k in RESOURCE_KEYS],
                         ";".join(map(str, row["seeds"])),
                         *["" if c.key not in row.get("metrics_sd", {}) else repr(float(row["metrics_sd"][c.key]))
                           for c in columns]])
    return buffer.getvalue()


def _latex_escape(text: str) -> str:
    return str(text).replace("\\", "\\textbackslash{}").replace("_", "\\_").replace("%", "\\%").replace("&", "\\&")


def to_latex(rows: list[dict], benchmark: str, caption: str | None = None) -> str:
    columns = _present_columns(rows, columns_for(benchmark))
    groups: list[tuple[str, int]] = []
    for c in columns:
        if groups and groups[-1][0] == c.group:
            groups[-1] = (c.group, groups[-1][1] + 1)
        else:
            groups.append((c.group, 1))
    spec = "lll" + "c" * len(columns)
    out = ["\\begin{table}[t]", "\\centering", "\\small"]
    spread = " Mean $\\pm$ sample sd over seeds where a row ran more than one." if any(
        row.get("metrics_sd") for row in rows) else ""
    out.append(f"\\caption{{{caption or _default_caption(benchmark) + spread}}}")
    out += ["\\resizebox{\\textwidth}{!}{%", f"\\begin{{tabular}}{{{spec}}}", "\\toprule"]
    head, rules, start = [" & & "], [], 4
    for name, width in groups:
        head.append(f"\\multicolumn{{{width}}}{{c}}{{{_latex_escape(name)}}}" if name else "")
        if name:
            rules.append(f"\\cmidrule(lr){{{start}-{start + width - 1}}}")
        start += width
    out.append(" & ".join(head).replace(" &  & ", " & & ", 1) + " \\\\")
    if rules:
        out.append("".join(rules))
    unit = benchmark_view(benchmark).table_unit
    out.append(" & ".join(["Model", unit, "Method", *[c.latex for c in columns]]) + " \\\\")
    out.append("\\midrule")
    previous = None
    for row in rows:
        block = (row["model"], row["unit"])
        if previous is not None and block != previous:
            out.append("\\midrule")
        first = block != previous
        cells = []
        for c in columns:
            text = fmt(row["metrics"].get(c.key), c.key)
            sd = row.get("metrics_sd", {}).get(c.key)
            cells.append((f"\\textbf{{{text}}}" if c.key in row["best"] else text)
                         + (f"$\\pm${fmt(sd, c.key)}" if sd is not None else ""))
        out.append(" & ".join([_latex_escape(row["model"]) if first else "",
                               _latex_escape(_unit_label(row)) if first else "",
                               _latex_escape(row["label"]), *cells]) + " \\\\")
        previous = block
    out += ["\\bottomrule", "\\end{tabular}}", "\\end{table}"]
    return "\n".join(out) + "\n"


def _default_caption(benchmark: str) -> str:
    return benchmark_view(benchmark).caption


def peak_memory_bytes(resources: dict) -> float | None:
    """A method cell's peak memory: training's CUDA peak on a GPU; on the CPU the peak RSS sampled during the
    cell, since training's CPU figure is the process's peak to date (earlier cells of the run included)."""
    train = resources.get("train_peak_memory_bytes")
    if train is not None and resources.get("peak_memory_source") != "process_peak_rss":
        return train
    return resources.get("cell_peak_rss_bytes") or train


def resources_table(results: list[dict]) -> str:
    """Markdown: wall time, peak memory and trainable parameters per (benchmark, model, method)."""
    groups = defaultdict(list)
    for r in results:
        if r.get("kind") == "method" and r.get("status") == "ok":
            groups[(r["benchmark"], r["model"], r["label"])].append(r.get("resources") or {})
    lines = ["Peak memory: training's CUDA peak on a GPU; on the CPU the resident memory sampled during the cell.", "",
             "| Benchmark | Model | Method | Train time (s) | Cell time (s) | Peak memory (MiB) | Trainable params | n |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for (bench, model, label), items in sorted(groups.items()):
        train = stats.finite_mean(i.get("train_wall_time_s") for i in items)
        cell = stats.finite_mean(i.get("cell_wall_time_s") for i in items)
        peak = stats.finite_mean(peak_memory_bytes(i) for i in items)
        params = stats.finite_mean(i.get("trainable_params") for i in items)
        lines.append(f"| {bench} | {model} | {label} | {fmt1(train)} | {fmt1(cell)} | "
                     f"{fmt1(peak / 2**20 if peak is not None else None)} | "
                     f"{'--' if params is None else f'{int(params):,}'} | {len(items)} |")
    gpu_groups = defaultdict(list)
    for r in results:
        resources = r.get("resources") or {}
        if r.get("status") == "ok" and resources.get("cell_peak_cuda_memory_bytes") is not None:
            gpu_groups[(r["benchmark"], r["model"], r["label"], resources.get("gpu_name") or "?")].append(resources)
    if gpu_groups:
        lines += ["", "GPU memory of whole cells (training and evaluation; torch's allocator peak):", "",
                  "| Benchmark | Model | Row | GPU | Cell peak GPU memory (MiB) | n |", "|---|---|---|---|---:|---:|"]
        for (bench, model, label, gpu), items in sorted(gpu_groups.items()):
            peak = max(i["cell_peak_cuda_memory_bytes"] for i in items)
            lines.append(f"| {bench} | {model} | {label} | {gpu} | {fmt1(peak / 2**20)} | {len(items)} |")
    return "\n".join(lines) + "\n"


def _per_item_values(result: dict | None, metric: str) -> dict[str, float | None] | None:
    """question -> a cell's per-item value of `metric` (TOFU's `per_item.forget_rouge_l`, ...), None if absent."""
    per_item = (result or {}).get("per_item") or {}
    values, questions = per_item.get(metric), per_item.get("forget_question")
    if not values or not questions or len(values) != len(questions):
        return None
    return dict(zip(questions, values))


def _other_items(mine: dict | None, source: dict | None) -> bool:
    """Whether two cells' per-item values (`_per_item_values`) cover different items (in_context asks only the
    held-out questions; under `limit` each cell scores its own first items): a row must then read every number on
    the items they share."""
    return mine is not None and source is not None and set(mine) != set(source)


def _scores_other_items(attack: dict, by_hash: dict, metric: str) -> bool:
    """`_other_items` of an attack cell and the cell it attacked."""
    source = by_hash.get(((attack.get("details") or {}).get("attack") or {}).get("attacked"))
    return _other_items(_per_item_values(attack, metric), _per_item_values(source, metric))


def _held_out_points(attack: dict, cells: dict, metric: str) -> dict:
    """The five numbers of one relearn attack cell on the same items: those its slice and the oracle's slice left
    out, among the items every one of the cells scored. `cells`: original, before, after, oracle, oracle_after (the
    last two may be None). Without any taught item (benign relearn, RWKU's passages) the cells' own numbers are
    those held-out numbers; with some, each cell needs its per-item values."""
    from ..metrics.recovery import held_out_mean

    taught = set(taught_questions(attack) or []) | set(taught_questions(cells["oracle_after"] or {}) or [])
    pairs = [("original", "before", "after"), ("oracle", "oracle_after")]
    maps = {key: _per_item_values(cell, metric) for key, cell in cells.items()}
    if not taught and not _other_items(maps["after"], maps["before"]):
        point = {key: derived_metrics(cell).get(metric) if cell else None for key, cell in cells.items()}
        return {**point, "n_items": None, "reason": None, "values": maps}   # each cell's items (intervals)
    if any(maps[key] is None for key in pairs[0]):
        return {"reason": f"no per-item {metric} to leave the attack's slice out"}
    if any(maps[key] is None for key in pairs[1]):
        maps["oracle"] = maps["oracle_after"] = None   # the control needs the same items; without them it is left out
    common = set.intersection(*(set(m) for m in maps.values() if m is not None))
    items = sorted(common - taught)
    if not items:
        return {"reason": "no held-out item"}
    point = {key: None if m is None else held_out_mean(m, items) for key, m in maps.items()}
    values = {key: None if m is None else {q: m[q] for q in items} for key, m in maps.items()}
    return {**point, "n_items": len(items), "reason": None, "values": values}


def robustness_rows(results: list[dict], benchmark: str) -> list[dict]:
    """One row per (model, unit, attacked row, attack): the benchmark's recovery metric before and after the attack
    (means over seeds, and RWKU targets), the recovery score (`metrics.recovery`: the share of the Original-to-
    unlearned gap the attack closes) and, beside it, the retain oracle's change under the same attack on the same
    scale. Empty when the benchmark names no recovery metric or the run has no attack cells.

    Each attack cell is read against its own references: the cell it attacked (the same seed), the Original and
    the oracle of its split or target, and the oracle under the same attack; then the five numbers are averaged
    over the row's attack cells (`n`). A mean over every seed of the unlearned row beside a mean over the seeds
    whose attack finished would compare different models. An attack that trained on forget items (relearn:
    `taught_questions`) or scored other items (in_context) is read on the items held out from it: per attack
    cell, its slice's questions and the oracle's slice's are dropped from all five numbers, so the gap and the
    recovery compare the same items. `items` says which were counted."""
    view = benchmark_view(benchmark)
    metric = view.recovery_metric
    if metric is None:
        return []
    usable = [r for r in results if r.get("benchmark") == benchmark and r.get("status") == "ok"
              and r.get("kind") != "finetune"]
    by_hash = {r.get("hash"): r for r in usable}
    cells: dict[tuple, list[dict]] = defaultdict(list)     # (model, unit, attacked label, attack label) -> cells
    for r in usable:
        info = (r.get("details") or {}).get("attack")
        # the oracle and the Original under an attack are its controls, not rows (`levels_rows` reads them)
        if r.get("kind") == "attack" and info and info.get("attacked_kind") not in CONTROL_KINDS:
            cells[(r["model"], view.row_unit(r), info["attacked_label"], info["attack_label"])].append(r)
    rows = []
    for key in sorted(cells, key=lambda k: [str(part) for part in k]):
        held_out = any(taught_questions(cell) is not None or _scores_other_items(cell, by_hash, metric)
                       for cell in cells[key])
        rows.append(_paired_row(key, cells[key], usable, by_hash, metric, held_out))
    return rows


def _paired_row(key: tuple, attack_cells: list[dict], results: list[dict], by_hash: dict, metric: str,
                held_out: bool) -> dict:
    """A robustness row: each attack cell with its own references (the cell it attacked, the Original and the
    oracle of its split or target, the oracle under the same attack), on the items held out from it
    (`_held_out_points`: all of them for an attack that showed none); the row's numbers only when every cell has
    them. `held_out` labels the row's items."""
    from ..metrics.recovery import recovery_score

    model, unit, label, attack = key

    def place(r):
        return (r.get("model"), r.get("split"), r.get("target"))

    points, reasons = [], []
    for cell in attack_cells:
        oracle_after = next((r for r in results if r.get("kind") == "attack" and place(r) == place(cell)
                             and ((r.get("details") or {}).get("attack") or {}).get("attacked_kind") == "retain"
                             and r["details"]["attack"].get("attack_label") == attack), None)
        refs = {"original": next((r for r in results if r.get("kind") == "original" and place(r) == place(cell)),
                                 None),
                "before": by_hash.get(cell["details"]["attack"].get("attacked")), "after": cell,
                "oracle": by_hash.get(oracle_after["details"]["attack"].get("attacked")) if oracle_after else None,
                "oracle_after": oracle_after}
        if refs["original"] is None or refs["before"] is None:
            reasons.append("no Original or attacked cell beside it")
            continue
        if refs["oracle"] is None:
            refs["oracle"] = refs["oracle_after"] = None
        point = _held_out_points(cell, refs, metric)   # an attack that showed no item: the cells' own numbers
        if point["reason"] is None and all(stats.is_number(point[k]) for k in ("original", "before", "after")):
            points.append(point)
        else:
            reasons.append(point["reason"] or f"no {metric}")

    def avg(name):
        got = [p[name] for p in points]
        return statistics.fmean(got) if got and all(stats.is_number(v) for v in got) else None

    original, before, after, oracle, oracle_after = (avg(k) for k in ("original", "before", "after", "oracle",
                                                                     "oracle_after"))
    if oracle is None or oracle_after is None:
        oracle = oracle_after = None
    score = None
    bounds: dict = {}
    if points and not reasons:   # every attack cell of the row read against its references, or no row number
        score = recovery_score(original, before, after, oracle=oracle, oracle_attacked=oracle_after)
        bounds = _recovery_intervals([p["values"] for p in points], oracle is not None)
    else:
        original = before = after = None
    counts = [p["n_items"] for p in points if p["n_items"] is not None]
    return {"model": model, "unit": unit, "label": label, "attack": attack, "metric": metric,
            "original": original, "before": before, "after": after, "recovery": score,
            "items": "held-out" if held_out else "all", "n_items": counts, "n": len(attack_cells),
            "reason": "; ".join(dict.fromkeys(reasons)) or None, "intervals": bounds}


def _recovery_intervals(values: list[dict], with_oracle: bool) -> dict:
    """Item-bootstrap intervals (`reporting.intervals`) of a robustness row's figures: the three levels, the gap
    and, where the gap is at least `MIN_REPORTED_GAP` in a resample, the shares (a resample with a smaller gap
    gives no share, as the table prints none)."""
    import numpy as np

    from ..metrics.recovery import MIN_REPORTED_GAP
    from .intervals import row_intervals

    def share(num, gap):
        return np.where(gap >= MIN_REPORTED_GAP, num / np.where(gap != 0, gap, np.nan), np.nan)

    figures = {"original": lambda m: m["original"], "before": lambda m: m["before"], "after": lambda m: m["after"],
               "gap": lambda m: m["original"] - m["before"],
               "score": lambda m: share(m["after"] - m["before"], m["original"] - m["before"])}
    points = [{k: v for k, v in point.items() if k in ("original", "before", "after")} for point in values]
    if with_oracle:
        figures["oracle_score"] = lambda m: share(m["oracle_after"] - m["oracle"], m["original"] - m["before"])
        figures["excess"] = lambda m: share(m["after"] - m["before"] - m["oracle_after"] + m["oracle"],
                                            m["original"] - m["before"])
        points = [{k: v for k, v in point.items() if k in ("original", "before", "after", "oracle",
                                                            "oracle_after")} for point in values]
    return row_intervals(points, figures)


#: The attacked kinds whose attack cells are the controls of a robustness row: the retain oracle (what the attack
#: teaches a model that never saw the forget set) and the Original (what the attack does to the model itself).
CONTROL_KINDS = ("retain", "original")


def _items_text(row: dict) -> str:
    """Which forget items a robustness row counts: all, or how many were held out of the attack's training."""
    if row["items"] == "all":
        return "all"
    counts = sorted(set(row["n_items"]))
    if not counts:
        return "all (none trained on)"   # a benign relearn, or RWKU's passages: no scored item was trained on
    return f"held-out ({counts[0] if len(counts) == 1 else f'{counts[0]}–{counts[-1]}'})"


def _lens_cells(results: list[dict], benchmark: str):
    """(result, its `details.logit_lens`) of each finished cell of `benchmark` that recorded one (or its reason
    for none: `skipped`)."""
    for r in results:
        lens = (r.get("details") or {}).get("logit_lens")
        if r.get("benchmark") == benchmark and r.get("status") == "ok" and lens:
            yield r, lens


def lens_rows(results: list[dict], benchmark: str) -> list[dict]:
    """One row per (model, unit, row label) of the cells that read the logit lens (`evaluation.logit_lens`): the
    output layer's forget probability and the best layer's, both on the items the lens read (a relearn attack's
    held-out items), means over seeds (and targets), with the best layers (1-based: layer L is the output) and the
    number of decoder blocks. A prompt attack's cell, which serves its attacked cell's model and copies that
    cell's lens, adds no row."""
    from ..metrics.recovery import recovery_score

    view = benchmark_view(benchmark)
    found: dict[tuple, list[dict]] = defaultdict(list)
    for r, lens in _lens_cells(results, benchmark):
        if "skipped" not in lens and "from_attacked_cell" not in lens:
            found[(r["model"], view.row_unit(r), r["label"])].append(r)
    rows = []
    for (model, unit, label), cells in found.items():
        lenses = [c["details"]["logit_lens"] for c in cells]
        rows.append({"model": model, "unit": unit, "label": label, "kind": cells[0].get("kind"),
                     "output": stats.finite_mean(lens["final"] for lens in lenses),
                     "best": stats.finite_mean(lens["best"] for lens in lenses),
                     "layers": sorted({lens["best_layer"] + 1 for lens in lenses}),
                     "n_layers": sorted({lens["n_layers"] for lens in lenses}), "recovery": None})
    # the lens as an attack on a method's row: unlearned = its output, attacked = its best layer, the top of the
    # gap the Original's best layer (the lens reads every model so); the oracle's best over its own output beside
    for row in rows:
        place = [r for r in rows if (r["model"], r["unit"]) == (row["model"], row["unit"])]
        original = next((r for r in place if r["kind"] == "original"), None)
        oracle = next((r for r in place if r["kind"] == "retain"), None)
        values = (original and original["best"], row["output"], row["best"])
        if row["kind"] != "method" or not all(stats.is_number(v) for v in values):
            continue
        both = oracle is not None and stats.is_number(oracle["output"]) and stats.is_number(oracle["best"])
        row["recovery"] = recovery_score(*values, oracle=oracle["output"] if both else None,
                                         oracle_attacked=oracle["best"] if both else None)
    return rows


def lens_markdown(results: list[dict], benchmark: str) -> list[str]:
    """Report lines for `lens_rows` (none when no cell recorded the lens)."""
    rows = lens_rows(results, benchmark)
    # a row whose model has no one layer stack (WHP) says so instead of a number
    skipped = {r["label"]: lens["skipped"] for r, lens in _lens_cells(results, benchmark) if "skipped" in lens}
    if not rows and not skipped:
        return []
    lines = ["Logit lens: each decoder block's output read through the final norm and the output head; the best "
             "block's forget probability beside the output's (higher = more of the forget set readable). A best "
             "layer far above the output's number is knowledge hidden below the output, not removed. Recovery (a "
             "method's row): the share of the gap from its output up to the Original's best layer that its own best "
             "layer closes; Oracle: the retain model's best layer over its output, on the same scale "
             "(docs/protocol.md, Attacks).", "",
             f"| Model | {benchmark_view(benchmark).table_unit} | Row | Output forget probability | "
             "Best-layer forget probability (layer l of L) | Recovery | Oracle | Excess |",
             "|---|---|---|---:|---|---:|---:|---:|"]
    for row in rows:
        layers = ", ".join(str(layer) for layer in row["layers"])
        total = "/".join(str(n) for n in row["n_layers"])
        where = f"layer{'s' if len(row['layers']) > 1 else ''} {layers} of {total}"
        rec = row["recovery"]
        shares = [fmt2(rec.score if rec else None), fmt2(rec.oracle_score if rec else None),
                  fmt2(rec.excess if rec else None)]
        if rec is not None and rec.score is not None and not share_shown(rec.gap):   # as the robustness table
            shares = [share_hidden_reason()] * 3
        lines.append(f"| {row['model']} | {row['unit']} | {row['label']} | {fmt2(row['output'])} | "
                     f"{fmt2(row['best'])} ({where}) | " + " | ".join(shares) + " |")
    return lines + [""] + [f"- {label}: no logit lens ({reason})." for label, reason in skipped.items()] + \
        ([""] if skipped else [])


def robustness_markdown(results: list[dict], benchmark: str) -> list[str]:
    """Report lines for `robustness_rows` and `lens_markdown` (none without attack cells or a lens)."""
    rows = robustness_rows(results, benchmark)
    lens = lens_markdown(results, benchmark)
    if not rows and not lens:
        return []
    lines = ["### Robustness: is the knowledge gone, or only hidden?", ""]
    if not rows:
        return lines + lens
    metric = rows[0]["metric"]
    lines += [f"Each attack on each row's model, scored on {metric} (higher = more of the forget set known). "
              "Recovery: the share of the Original-to-unlearned gap the attack closes (0 = nothing comes back, 1 = "
              "all of it; below 0, the attack lowered the forget score further). Oracle: what the same attack does to "
              "the retain model, on the same scale; recovery beyond it is knowledge that was hidden, not removed "
              "(docs/protocol.md). n: the attack cells averaged (seeds, and RWKU targets), each read against the "
              "cell it attacked, so Unlearned is the mean over the same seeds as Attacked.", ""]
    held_out = list(dict.fromkeys(row["attack"] for row in rows if row["items"] == "held-out"))
    if held_out:
        # relearn trains on a slice of the forget set, in_context shows some of its pairs: both read the rest only
        lines += [f"Rows of {', '.join(held_out)} count the held-out forget items only: the forget questions the "
                  "attack showed the model (a relearn slice, in-context examples), and those it showed the oracle, "
                  "are left out of all five numbers (Original, Unlearned, Attacked, the oracle before and after), "
                  "per seed, so the gap and the recovery compare the same items. Items: how many were counted (none "
                  "shown: a benign relearn, or RWKU's passages, where every scored item is held out).", ""]
    lines += [f"| Model | {benchmark_view(benchmark).table_unit} | Method | Attack | Items | Original | Unlearned | "
              "Attacked | Recovery | Oracle | Excess | n |", "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for row in rows:
        rec = row["recovery"]
        bounds = row.get("intervals") or {}
        cells = [fmt_interval(row[k], bounds.get(k)) for k in ("original", "before", "after")]
        cells += _share_cells(row)
        lines.append(f"| {row['model']} | {row['unit']} | {row['label']} | {row['attack']} | {_items_text(row)} | "
                     + " | ".join(cells) + f" | {row['n']} |")
        name = f"- {row['label']} + {row['attack']} ({row['unit']})"
        if row.get("reason"):
            what = "on held-out items" if row["items"] == "held-out" else "against its references"
            notes.append(f"{name}: not scored {what} ({row['reason']}).")
        elif rec is not None and rec.score is None:   # a recovery share of no gap is undefined, not 0
            notes.append(f"{name}: no recovery: the unlearned model's forget score is not below the Original's, "
                         "so there is no gap to close.")
        elif rec is not None and not share_shown(rec.gap):
            notes.append(f"{name}: no recovery share: the gap ({fmt2(rec.gap)}) is below {MIN_REPORTED_GAP:g}, "
                         "too small to divide by (docs/protocol.md, \"Recovery shares and their minimum gap\"); "
                         "read the absolute levels.")
        elif rec is not None and rec.oracle_change is None:
            notes.append(f"{name}: no oracle beside it (the retain oracle under this attack has no cell).")
    if any(row.get("intervals") for row in rows):
        lines += ["", intervals_describe() + "; a number without one: its cells store no per-item values."]
    return (lines + ([""] + notes if notes else []) + [""] + robustness_matrix_markdown(rows, benchmark)
            + levels_markdown(results, benchmark) + noise_floor_markdown(results, benchmark)
            + mc_markdown(results, benchmark) + lens)


def _share_cells(row: dict) -> list[str]:
    """A robustness row's Recovery, Oracle and Excess cells: each share with its interval, or why there is none
    (a gap under `MIN_REPORTED_GAP`: `gap < 0.05`; no gap at all or no number: `--`)."""
    rec, bounds = row["recovery"], row.get("intervals") or {}
    if rec is not None and rec.score is not None and not share_shown(rec.gap):
        return [share_hidden_reason()] * 3
    return [fmt_interval(getattr(rec, k) if rec else None, bounds.get(k)) for k in ("score", "oracle_score", "excess")]


def _matrix_blocks(rows: list[dict]):
    """Per (model, unit) of robustness-style rows: (model, unit, its rows, its attacks sorted, the most cells any
    entry averages, (label, attack) -> row), for the methods-by-attacks matrices."""
    blocks: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        blocks[(row["model"], row["unit"])].append(row)
    for (model, unit), block in blocks.items():
        yield (model, unit, block, sorted({row["attack"] for row in block}), max(row["n"] for row in block),
               {(row["label"], row["attack"]): row for row in block})


def robustness_matrix_markdown(rows: list[dict], benchmark: str) -> list[str]:
    """`robustness_rows` read at a glance: per (model, unit), one table of methods by attacks, each entry the
    recovery with the oracle's change under the same attack in brackets. An entry averaging fewer attack cells
    than the table's most says how many (a run still computing its seeds). Gap: the Original's score minus the
    unlearned model's, on all items (an attack row that scored all of them), the denominator of every share in
    the row: where it is small, the shares swing wide."""
    lines = []
    for model, unit, block, attacks, most, found in _matrix_blocks(rows):
        lines += [f"Recovery by method and attack, {model}, {benchmark_view(benchmark).table_unit.lower()} {unit} (in "
                  f"parentheses: the oracle's change under the same attack; each entry averages {most} attack "
                  "cell(s) unless it says n; Gap: the Original's score minus the unlearned one's on all items, the "
                  "shares' denominator):", "",
                  "| Method | Gap | " + " | ".join(attacks) + " |", "|---|---:|" + "---:|" * len(attacks)]
        for label in dict.fromkeys(row["label"] for row in block):
            gap = next((row["original"] - row["before"] for row in block if row["label"] == label
                        and row["items"] == "all" and stats.is_number(row["original"])
                        and stats.is_number(row["before"])), None)
            gap_row = next((row for row in block if row["label"] == label and row["items"] == "all"
                            and stats.is_number(row["original"]) and stats.is_number(row["before"])), None)
            entries = [fmt_interval(gap, (gap_row.get("intervals") or {}).get("gap") if gap_row else None)]
            for attack in attacks:
                row = found.get((label, attack))
                if row is None:
                    entries.append("–")
                    continue
                rec = row["recovery"]
                if rec is not None and rec.score is not None and not share_shown(rec.gap):
                    entry = share_hidden_reason()
                else:
                    bounds = row.get("intervals") or {}
                    entry = (f"{fmt_interval(rec.score if rec else None, bounds.get('score'))} "
                             f"({fmt2(rec.oracle_score if rec else None)})")
                entries.append(entry + (f" n={row['n']}" if row["n"] < most else ""))
            lines.append(f"| {label} | " + " | ".join(entries) + " |")
        lines.append("")
    return lines


def mc_rows(results: list[dict], benchmark: str) -> list[dict]:
    """One row per (model, unit, attacked row) of the paraphrase cells' multiple-choice form
    (`metrics.forget_mc_prob`: the correct answer's normalised probability among it and the perturbed ones), the
    mean over seeds, in the order the cells come."""
    view = benchmark_view(benchmark)
    found: dict[tuple, list[float]] = defaultdict(list)
    for r in results:
        value = (r.get("metrics") or {}).get("forget_mc_prob")
        if r.get("benchmark") == benchmark and r.get("status") == "ok" and stats.is_number(value):
            attack = ((r.get("details") or {}).get("attack") or {})
            found[(r["model"], view.row_unit(r), attack.get("attacked_label", r["label"]),
                   attack.get("attack_label", ""))].append(value)
    return [{"model": model, "unit": unit, "label": label, "attack": attack, "mc_prob": stats.finite_mean(values),
             "n": len(values)} for (model, unit, label, attack), values in found.items()]


def mc_markdown(results: list[dict], benchmark: str) -> list[str]:
    """Report lines for `mc_rows` (none without a paraphrase cell that scored the multiple-choice form)."""
    rows = mc_rows(results, benchmark)
    if not rows:
        return []
    lines = ["Multiple-choice form of the paraphrase attack: each paraphrased forget question with its true answer "
             "and the perturbed ones as options; the true answer's probability, normalised over the options "
             "(TOFU's Real Authors formula; higher = more of the forget set known; the oracle's row is the level of "
             "a model that never saw the authors).", "",
             f"| Model | {benchmark_view(benchmark).table_unit} | Row | Attack | MC probability | n |",
             "|---|---|---|---|---:|---:|"]
    lines += [f"| {r['model']} | {r['unit']} | {r['label']} | {r['attack']} | {fmt2(r['mc_prob'])} | {r['n']} |"
              for r in rows]
    return lines + [""]


def fmt2(value) -> str:
    return "--" if not stats.is_number(value) else f"{value:.2f}"


def fmt1(value) -> str:
    return "--" if not stats.is_number(value) else f"{value:.1f}"


# ------------------------------------------------------------------------------------------------ absolute levels
#: The forget metrics the absolute-level tables read (result key, name): TOFU's ROUGE-L, correct-answer rate
#: (the forget answers classed `correct`, `metrics.failure`) and probability; a benchmark without them reads its
#: recovery metric alone.
LEVEL_METRICS = (("forget_rouge_l", "ROUGE-L"), ("fc_forget_correct", "correct-answer rate"),
                 ("forget_prob", "probability"))
_CORRECT = "fc_forget_correct"


def _item_map(result: dict | None, metric: str) -> dict[str, float | None] | None:
    """question -> a cell's per-item value of `metric`; the correct-answer rate from the per-item answer classes
    (`per_item.forget_answer_class`, stored by cells computed since; None before)."""
    if metric != _CORRECT:
        return _per_item_values(result, metric)
    classes = _per_item_values(result, "forget_answer_class")
    return None if classes is None else {q: None if c is None else float(c == "correct") for q, c in classes.items()}


def _control_cell(results: list[dict], cell: dict, attack: str, kind: str) -> dict | None:
    """The attack cell of the same place and attack whose attacked cell is the `kind` control (retain, original)."""
    place = (cell.get("model"), cell.get("split"), cell.get("target"))
    return next((r for r in results if r.get("kind") == "attack" and r.get("status") == "ok"
                 and (r.get("model"), r.get("split"), r.get("target")) == place
                 and ((r.get("details") or {}).get("attack") or {}).get("attacked_kind") == kind
                 and r["details"]["attack"].get("attack_label") == attack), None)


def _level_point(cells: dict, metric: str) -> dict:
    """One attack cell's level and its controls' (`after`, `oracle_after`, `original_after`; a control may be
    None) on the same items: those no one of them was shown (relearn's slices, in-context pairs), among the items
    all of them scored; the cells' own numbers when none was shown and they scored the same items."""
    from ..metrics.recovery import held_out_mean

    taught = set().union(*(set(taught_questions(c) or []) for c in cells.values() if c))
    maps = {key: _item_map(cell, metric) if cell else None for key, cell in cells.items()}
    present = [m for m in maps.values() if m is not None]
    same = all(set(m) == set(present[0]) for m in present) if present else True
    if not taught and same:
        point = {key: derived_metrics(cell).get(metric) if cell else None for key, cell in cells.items()}
        return {"values": point, "maps": maps, "n_items": None, "reason": None}
    if maps["after"] is None:
        return {"reason": f"no per-item {metric} to leave the shown items out"}
    items = sorted(set.intersection(*(set(m) for m in present)) - taught)
    if not items:
        return {"reason": "no held-out item"}
    values = {key: None if m is None else held_out_mean(m, items) for key, m in maps.items()}
    kept = {key: None if m is None else {q: m[q] for q in items} for key, m in maps.items()}
    return {"values": values, "maps": kept, "n_items": len(items), "reason": None}


def levels_rows(results: list[dict], benchmark: str) -> list[dict]:
    """The headline reading of each robustness row (`robustness_rows`' keys): the attacked model's absolute forget
    level beside the retain oracle's and the Original's under the same attack, on every `LEVEL_METRICS` metric the
    cells have, each attack cell with its controls on the same items, then averaged over the row's cells; with
    item-bootstrap intervals (`reporting.intervals`) and the attacked level minus the oracle's."""
    from .intervals import row_intervals

    view = benchmark_view(benchmark)
    usable = [r for r in results if r.get("benchmark") == benchmark and r.get("status") == "ok"
              and r.get("kind") != "finetune"]
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in usable:
        info = (r.get("details") or {}).get("attack")
        if r.get("kind") == "attack" and info and info.get("attacked_kind") not in CONTROL_KINDS:
            cells[(r["model"], view.row_unit(r), info["attacked_label"], info["attack_label"])].append(r)
    derived = {r.get("hash"): derived_metrics(r) for r in usable}
    metrics = [(key, name) for key, name in LEVEL_METRICS if any(stats.is_number(d.get(key)) for d in derived.values())]
    if not metrics and view.recovery_metric:
        metrics = [(view.recovery_metric, view.recovery_metric)]
    rows = []
    for metric, name in metrics:
        for key in sorted(cells, key=lambda k: [str(part) for part in k]):
            model, unit, label, attack = key
            points, reasons = [], []
            for cell in cells[key]:
                refs = {"after": cell, "oracle_after": _control_cell(usable, cell, attack, "retain"),
                        "original_after": _control_cell(usable, cell, attack, "original")}
                point = _level_point(refs, metric)
                (reasons.append(point["reason"]) if point["reason"] else points.append(point))
            means = {}
            for ref in ("after", "oracle_after", "original_after"):
                got = [p["values"][ref] for p in points]
                means[ref] = statistics.fmean(got) if got and not reasons and all(stats.is_number(v) for v in got) \
                    else None
            figures = {ref: (lambda m, ref=ref: m[ref]) for ref in means}
            figures["difference"] = lambda m: m["after"] - m["oracle_after"]
            bounds = row_intervals([p["maps"] for p in points], figures) if points and not reasons else {}
            difference = means["after"] - means["oracle_after"] if all(
                stats.is_number(means[r]) for r in ("after", "oracle_after")) else None
            counts = [p["n_items"] for p in points if p["n_items"] is not None]
            rows.append({"model": model, "unit": unit, "label": label, "attack": attack, "metric": metric,
                         "metric_name": name, **means, "difference": difference, "intervals": bounds,
                         "items": "held-out" if counts else "all", "n_items": counts, "n": len(cells[key]),
                         "reason": "; ".join(dict.fromkeys(reasons)) or None})
    return rows


def levels_markdown(results: list[dict], benchmark: str) -> list[str]:
    """Report lines for `levels_rows`: one table per metric, and what the missing controls and intervals lack."""
    rows = levels_rows(results, benchmark)
    if not rows:
        return []
    unit = benchmark_view(benchmark).table_unit
    lines = ["Absolute levels under each attack (the headline reading): the attacked model's forget score beside "
             "the retain oracle's under the same attack (a model that never saw the forget set: what the attack "
             "teaches or breaks by itself) and the Original's under it (what the attack does to the model before "
             "unlearning: int4, for one, lowers it). Knowledge came back only where the attacked level rises above "
             "the oracle's under the same attack, beyond its interval; Attacked − oracle is that difference. Each "
             "attack cell is read with its controls on the same items (those none of them was shown), then "
             "averaged over the row's cells (n). " + intervals_describe() + ".", ""]
    lines += levels_matrix_markdown([row for row in rows if row["metric"] == rows[0]["metric"]], unit)
    for metric in dict.fromkeys(row["metric"] for row in rows):
        mine = [row for row in rows if row["metric"] == metric]
        lines += [f"Forget {mine[0]['metric_name']} under each attack:", "",
                  f"| Model | {unit} | Method | Attack | Items | Attacked | Oracle + attack | Original + attack | "
                  "Attacked − oracle | n |", "|---|---|---|---|---|---:|---:|---:|---:|---:|"]
        for row in mine:
            bounds = row["intervals"]
            cells = [fmt_interval(row[k], bounds.get(k)) for k in ("after", "oracle_after", "original_after",
                                                                   "difference")]
            lines.append(f"| {row['model']} | {row['unit']} | {row['label']} | {row['attack']} | {_items_text(row)} "
                         f"| " + " | ".join(cells) + f" | {row['n']} |")
        lines.append("")
    # an attack with no oracle cell either (detach: nothing to remove from a model without a bundle) has no control
    no_original = list(dict.fromkeys(row["attack"] for row in rows if row["original_after"] is None
                                     and not row["reason"] and row["oracle_after"] is not None))
    if no_original:
        lines += [f"- No Original + attack cell for {', '.join(no_original)}: the run has no such control (plans "
                  "include it since issue 77; `cru-harness run` computes it), so there what the attack does to the "
                  "model itself (int4 lowering every model's score) cannot be told from nothing coming back.", ""]
    for row in rows:
        if row["reason"]:
            why = " (cells store the per-item answer classes since issue 77)" if row["metric"] == _CORRECT else ""
            lines.append(f"- {row['label']} + {row['attack']}, {row['metric_name']}: no level on the items held out "
                         f"from the attack ({row['reason']}{why}).")
    return lines + ([""] if any(row["reason"] for row in rows) else [])


def levels_matrix_markdown(rows: list[dict], unit_name: str) -> list[str]:
    """One metric's `levels_rows` read at a glance: per (model, unit), one table of methods by attacks, each entry
    the attacked level and, in parentheses, its difference from the oracle's under the same attack with that
    difference's interval; above them the two controls' levels under each attack. A control's entry is shown where
    every method's row read it on the same items (otherwise each row's own is in the table below). An entry
    averaging fewer attack cells than the table's most says how many (a run still computing its seeds)."""
    lines = []
    for model, unit, block, attacks, most, found in _matrix_blocks(rows):
        lines += [f"Forget {block[0]['metric_name']} by method and attack, {model}, {unit_name.lower()} {unit}: the "
                  "attacked model's level and, in parentheses, that level minus the retain oracle's under the same "
                  "attack, with its interval (above 0 beyond the interval: more came back than the attack gives a "
                  "model that never saw the forget set); the first two rows are the controls under each attack; "
                  f"each entry averages {most} attack cell(s) unless it says n:", "",
                  "| Row | " + " | ".join(attacks) + " |", "|---|" + "---:|" * len(attacks)]
        for control, key in (("Retain (oracle) + attack", "oracle_after"), ("Original + attack", "original_after")):
            entries = []
            for attack in attacks:
                shown = {fmt_interval(row[key], row["intervals"].get(key)) for row in block
                         if row["attack"] == attack and not row["reason"]}
                entries.append(shown.pop() if len(shown) == 1 else "per row")
            lines.append(f"| {control} | " + " | ".join(entries) + " |")
        for label in dict.fromkeys(row["label"] for row in block):
            entries = []
            for attack in attacks:
                row = found.get((label, attack))
                if row is None:
                    entries.append("–")
                    continue
                entry = "--" if row["reason"] else (
                    f"{fmt2(row['after'])} ({fmt_interval(row['difference'], row['intervals'].get('difference'))})")
                entries.append(entry + (f" n={row['n']}" if row["n"] < most else ""))
            lines.append(f"| {label} | " + " | ".join(entries) + " |")
        lines.append("")
    return lines


# ------------------------------------------------------------------------------------------------ noise floor
def noise_floor_rows(results: list[dict], benchmark: str) -> list[dict]:
    """Per (model, unit, attacked row, quantize attack): the rounding's relative weight change
    (`details.quantize.relative_weight_change`) beside the unlearning's change from the model it started from
    (`unlearning_weight_change`, recorded since issue 77), means over the row's cells, in the order they come."""
    view = benchmark_view(benchmark)
    found: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        details = r.get("details") or {}
        if r.get("benchmark") == benchmark and r.get("status") == "ok" and details.get("quantize"):
            attack = details.get("attack") or {}
            found[(r["model"], view.row_unit(r), attack.get("attacked_label", r["label"]),
                   attack.get("attack_label", ""))].append(details["quantize"])
    rows = []
    for (model, unit, label, attack), records in found.items():
        rounding = stats.finite_mean(q.get("relative_weight_change") for q in records)
        unlearning = stats.finite_mean(q.get("unlearning_weight_change") for q in records)
        if any(not stats.is_number(q.get("unlearning_weight_change")) for q in records):
            unlearning = None   # a mean over some of the cells would read as the row's
        rows.append({"model": model, "unit": unit, "label": label, "attack": attack, "rounding": rounding,
                     "unlearning": unlearning, "n": len(records)})
    return rows


def noise_floor_markdown(results: list[dict], benchmark: str) -> list[str]:
    """Report lines for `noise_floor_rows` (none without a quantize cell)."""
    rows = noise_floor_rows(results, benchmark)
    if not rows:
        return []
    lines = ["Quantization noise floor: the relative change of the rounded weights (‖W_q − W‖ / ‖W‖ over the "
             "quantized linear layers) beside the unlearning's own change from the model it started from, over the "
             "same layers. Where unlearning moved the weights by much less than the rounding does, the rounding can "
             "undo it (Zhang et al. 2024); where the rounding is far larger than anything unlearning did, a lower "
             "forget score under it is the rounding's damage (the Original + attack control shows how much).", "",
             f"| Model | {benchmark_view(benchmark).table_unit} | Row | Attack | Rounding's change | Unlearning's "
             "change | Rounding / unlearning | n |", "|---|---|---|---|---:|---:|---:|---:|"]
    for row in rows:
        ratio = row["rounding"] / row["unlearning"] if stats.is_number(row["rounding"]) and \
            stats.is_number(row["unlearning"]) and row["unlearning"] > 0 else None
        lines.append(f"| {row['model']} | {row['unit']} | {row['label']} | {row['attack']} | "
                     f"{_small(row['rounding'])} | {_small(row['unlearning'])} | {fmt1(ratio)} | {row['n']} |")
    if any(row["unlearning"] is None for row in rows):
        lines += ["", "- Unlearning's change --: cells computed before issue 77 record the rounding's change only "
                  "(recomputing them records both)."]
    return lines + [""]


def _small(value) -> str:
    """A weight change: three significant digits (they span 1e-6 to 1e-1)."""
    return "--" if not stats.is_number(value) else f"{value:.3g}"


# ------------------------------------------------------------------------------------------------ privacy intervals
def _privacy_sides(result: dict | None) -> tuple[dict, dict] | None:
    """(forget, holdout): question -> privleak's attack score (`per_item.privacy_*`, stored since issue 77)."""
    per_item = (result or {}).get("per_item") or {}
    questions, sets, scores = (per_item.get(k) for k in ("privacy_question", "privacy_set", "privacy_min_k"))
    if not questions or not sets or not scores or not len(questions) == len(sets) == len(scores):
        return None
    forget = {q: s for q, label, s in zip(questions, sets, scores) if label == 0}
    holdout = {q: s for q, label, s in zip(questions, sets, scores) if label == 1}
    return (forget, holdout) if forget and holdout else None


def privacy_interval_rows(results: list[dict], benchmark: str) -> list[dict]:
    """Per leaderboard row whose cells store per-item privacy scores: privleak, privleak's MIA AUC (Min-K%) and
    Forget Quality, the means over seeds the leaderboard shows, each with its item-bootstrap interval: forget and
    holdout items resampled apart (each keeps its size), the same draw for a cell and its oracle (privleak compares
    them on the same items), the AUCs and privleak recomputed; Forget Quality's KS p-value on resampled forget
    items, the same items for the cell and the oracle."""
    import numpy as np

    from ..metrics.privacy import PRIVLEAK_DEFAULT_RETAIN_AUC
    from .intervals import SEED, auc_resamples, interval, ks_pvalue_resamples, side_weights

    view = benchmark_view(benchmark)
    usable = [r for r in results if r.get("benchmark") == benchmark and r.get("status") == "ok"
              and r.get("kind") in ("method", "original", "retain")]
    if not any(_privacy_sides(r) for r in usable):
        return []
    oracle = {(r["model"], r.get("split")): r for r in usable if r.get("kind") == "retain"}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in usable:
        groups[(r["model"], view.row_unit(r), r["label"])].append(r)
    rows = []
    for (model, unit, label), cells in groups.items():
        sides = [_privacy_sides(c) for c in cells]
        refs = [oracle.get((c["model"], c.get("split"))) for c in cells]
        derived = [derived_metrics(c) for c in cells]
        row = {"model": model, "unit": unit, "label": label, "n": len(cells),
               **{k: stats.finite_mean(d.get(k) for d in derived) for k in ("privleak", "mia_auc_min_k",
                                                                          "forget_quality")},
               "intervals": {}}
        if all(sides):
            forget_side = side_weights([q for s in sides for q in s[0]], seed=SEED)
            holdout_side = side_weights([q for s in sides for q in s[1]], seed=SEED + 1)   # drawn apart
            aucs, leaks = [], []
            for (forget, holdout), ref in zip(sides, refs):
                auc = auc_resamples(forget, holdout, forget_side, holdout_side)
                ref_sides = _privacy_sides(ref)
                ref_auc = auc_resamples(*ref_sides, forget_side, holdout_side) if ref_sides else \
                    np.full_like(auc, PRIVLEAK_DEFAULT_RETAIN_AUC)
                aucs.append(auc)
                leaks.append(((1 - auc) - (1 - ref_auc)) / ((1 - ref_auc) + 1e-10) * 100.0)
            row["intervals"]["mia_auc_min_k"] = interval(np.mean(aucs, axis=0))
            row["intervals"]["privleak"] = interval(np.mean(leaks, axis=0))
        fq = []
        for cell, ref in zip(cells, refs):
            mine, theirs = _per_item_values(cell, "forget_truth_ratio"), _per_item_values(ref, "forget_truth_ratio")
            fq.append(ks_pvalue_resamples(mine, theirs) if mine and theirs and cell is not ref else None)
        if fq and all(f is not None for f in fq):
            row["intervals"]["forget_quality"] = interval(np.mean(fq, axis=0))
        rows.append(row)
    return rows


def privacy_intervals_markdown(results: list[dict], benchmark: str) -> list[str]:
    """Report lines for `privacy_interval_rows` (none when no cell stores per-item privacy scores)."""
    from .intervals import describe

    rows = privacy_interval_rows(results, benchmark)
    if not rows:
        return []
    lines = ["### Privacy with item-bootstrap intervals", "",
             "privleak (against the retain oracle's Min-K% AUC), that AUC and Forget Quality, the leaderboard's means "
             "over seeds, each with the interval of its items resampled: forget and holdout items apart, the same "
             f"draw for a cell and its oracle. {describe()}; a number without one: some cell of the row stores no "
             "per-item privacy scores (cells computed before issue 77).", "",
             f"| Model | {benchmark_view(benchmark).table_unit} | Row | privleak | MIA AUC (Min-K%) | FQ | n |",
             "|---|---|---|---:|---:|---:|---:|"]
    for row in rows:
        bounds = row["intervals"]
        fq = bounds.get("forget_quality")
        fq_text = fmt(row["forget_quality"], "forget_quality") + (
            "" if fq is None else f" [{fmt(fq[0], 'forget_quality')}, {fmt(fq[1], 'forget_quality')}]")
        lines.append(f"| {row['model']} | {row['unit']} | {row['label']} | "
                     f"{fmt_interval(row['privleak'], bounds.get('privleak'), 1)} | "
                     f"{fmt_interval(row['mia_auc_min_k'], bounds.get('mia_auc_min_k'))} | {fq_text} | {row['n']} |")
    return lines + [""]
