"""A sweep study's table and plots from the runner's cells: one row per variant (method `label`) and block
(model, benchmark, split), each number the mean ± sd over seeds (RWKU: first the mean over targets per seed).

The numbers are the leaderboard's (`reporting.tables.derived_metrics`: the same forget / utility axes and
failure classes), so a study row and a leaderboard row of the same cell never disagree.
"""
from __future__ import annotations

import csv
import io
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..cru.losses import collapsed_gate
from ..reporting.router_lr import cru_setting
from ..reporting.stats import finite_mean, is_number
from ..reporting.tables import FAILURE_CLASSES, derived_metrics, fill_from_oracle, scientific

# (key in the derived metrics, header): after the benchmark's own `study_keys` (its forget and utility axes, then
# the retain / neighbour scores to watch), the forget answers' failure classes, the gates and the cost.
COMMON_KEYS = [*[(f"fc_forget_{c}", f"forget {c}") for c in FAILURE_CLASSES],
               ("gate_forget", "gate forget"), ("gate_retain", "gate retain"),
               ("train_wall_time_s", "train s"), ("cell_wall_time_s", "cell s")]


def study_keys(benchmark: str) -> list[tuple[str, str]]:
    """The (key, header) pairs a study table shows for a benchmark's rows."""
    from .. import plugins

    return [*plugins.benchmarks.get(benchmark).study_keys, *COMMON_KEYS]


REFERENCE_ROWS = ("Original", "Retain")
#: A sweep plot's axis name for the CRU hyper-parameters a sweep varies (the config's key is the fallback).
AXIS_NAMES = {"lam": "λ (weight of the retain term)", "lr": "router learning rate",
              "percentile": "selection percentile p", "d_r": "router width d_r", "epochs": "epochs",
              "last_k": "gated blocks (the last k)", "retain_batch_ratio": "retain rows per forget row in a batch",
              "exclude_top_magnitude": "% of largest-magnitude coordinates excluded"}


def cell_values(result: dict) -> dict[str, float | None]:
    """Every number a study row shows for one cell."""
    values = derived_metrics(result)
    gates = result.get("gate_means") or {}
    values["gate_forget"], values["gate_retain"] = gates.get("forget"), gates.get("retain")
    resources = result.get("resources") or {}
    for key in ("train_wall_time_s", "cell_wall_time_s"):
        values[key] = resources.get(key)
    return values


def mean_sd(values) -> tuple[float | None, float | None, int]:
    """Mean and sample sd (ddof 1; None for one value) of the finite values, and how many there were. Both are
    computed exactly before rounding (`finite_mean`, `statistics.stdev`): the order of the seeds does not matter."""
    finite = [float(v) for v in values if is_number(v)]
    if not finite:
        return None, None, 0
    return finite_mean(finite), (statistics.stdev(finite) if len(finite) > 1 else None), len(finite)


def block_name(result: dict) -> str:
    from .. import plugins

    where = result.get("split") if plugins.benchmarks.get(result.get("benchmark")).unit == "split" else "targets"
    return f"{result.get('model')} · {result.get('benchmark')} {where}"


def study_rows(results: list[dict], label_order: list[str], x: str | None = None) -> list[dict]:
    """Rows {block, benchmark, label, seeds, x, n_units, stats: {key: (mean, sd, n)}} over the finished cells
    (status ok; finetune cells are not rows). Reference rows first, then the config's method order."""
    results = fill_from_oracle([dict(r) for r in results if r.get("status") == "ok"])
    grouped: dict[tuple, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for result in results:
        if result.get("kind") == "finetune":
            continue
        # the references (Original, Retain) have no seed: None, shown as "–"
        grouped[(block_name(result), result["benchmark"], result["label"])][result.get("seed")].append(result)
    order = {label: i for i, label in enumerate([*REFERENCE_ROWS, *label_order])}
    rows = []
    for (block, benchmark, label), by_seed in sorted(grouped.items(),
                                                     key=lambda kv: (kv[0][0], order.get(kv[0][2], 1e9), kv[0][2])):
        per_seed = {seed: [cell_values(r) for r in cells] for seed, cells in by_seed.items()}
        row_stats = {}
        for key in dict.fromkeys([*(k for k, _ in study_keys(benchmark)), "forgetting", "utility"]):
            # RWKU: one number per seed (the mean over its targets), then the spread over seeds
            seed_means = [mean_sd([v.get(key) for v in values])[0] for values in per_seed.values()]
            row_stats[key] = mean_sd(seed_means)
        any_cell = next(iter(by_seed.values()))[0]
        xs = {(r.get("hparams") or {}).get(x) for cells in by_seed.values() for r in cells} if x else set()
        rows.append({"block": block, "benchmark": benchmark, "label": label,
                     "seeds": sorted(by_seed, key=lambda seed: (seed is not None, seed or 0)),
                     "collapsed_gate": router_null_gate(any_cell),
                     "n_units": max(len(cells) for cells in by_seed.values()),
                     "x": xs.pop() if len(xs) == 1 else None, "hparams": any_cell.get("hparams") or {},
                     "stats": row_stats})
    mark_pareto(rows)
    return rows


def router_null_gate(result: dict) -> float | None:
    """A CRU cell's collapsed-router gate (`cru.collapsed_gate` for its lambda and loss shapes): where a router
    that cannot tell forget from retain settles. A retain gate near it says the router did not separate them."""
    from .. import plugins

    method = result.get("method")
    if method not in plugins.methods.names() or not plugins.methods.get(method).adapter:   # no routers
        return None
    return collapsed_gate(float(cru_setting(result, "lam")), **loss_shape(result))


def loss_shape(result: dict) -> dict[str, str]:
    """A CRU cell's (or study row's) `suppress_loss` and `pass_loss` (`reporting.router_lr.cru_setting`)."""
    return {name: cru_setting(result, name) for name in ("suppress_loss", "pass_loss")}


def mark_pareto(rows: list[dict]) -> None:
    """`row["pareto"]`: on the forget-vs-utility Pareto front of its block's variants (means over seeds; the
    reference rows Original / Retain are not candidates), None where an axis is missing."""
    from ..reporting.stats import pareto_dominated

    for block in dict.fromkeys(r["block"] for r in rows):
        candidates = [r for r in rows if r["block"] == block and r["label"] not in REFERENCE_ROWS]
        points = {r["label"]: (r["stats"]["forgetting"][0], r["stats"]["utility"][0]) for r in candidates}
        dominated = pareto_dominated(points)
        for row in candidates:
            complete = all(is_number(v) for v in points[row["label"]])
            row["pareto"] = (not dominated[row["label"]]) if complete else None


def fmt(mean, sd, n: int | None = None, of: int | None = None, key: str = "") -> str:
    """`mean ± sd`; with `n` of `of` seeds when fewer seeds than the row's have the value (not averaged silently).
    Within a seed an RWKU value is the mean over the targets that have it (the report notes tasks a target lacks).
    A Forget Quality below 0.01 is written in scientific notation, as in the leaderboard (0.000 would hide it)."""
    if mean is None:
        return "–"
    spec = ".1e" if scientific(key, mean) else ".1f" if abs(mean) >= 10 else ".3f"
    text = f"{mean:{spec}}" if sd is None else f"{mean:{spec}} ± {sd:{spec}}"
    return text + (f" ({n} of {of} seeds)" if n is not None and of is not None and n < of else "")


def to_markdown(rows: list[dict], header: list[str], x: str | None = None) -> str:
    """One table per block, under `header` lines (model, scale, seeds) that every study table states."""
    lines = [*header, "Pareto front: no other variant of the block has both more forgetting and more utility "
             "(TOFU: 1 - forget ROUGE-L and MU; RWKU: 1 - forget All, FB / QA / AA weighted by their item "
             "counts, and mean utility; means over seeds).", ""]
    for block in dict.fromkeys(r["block"] for r in rows):
        block_rows = [r for r in rows if r["block"] == block]
        keys = study_keys(block_rows[0]["benchmark"])
        columns = ["variant", *([x] if x else []), "seeds", *[h for _, h in keys], "collapsed-router gate",
                   "Pareto front"]
        lines += [f"### {block}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for row in block_rows:
            cells = [row["label"], *([str(row["x"]) if row["x"] is not None else "–"] if x else []),
                     seeds_text(row["seeds"], ","),
                     *[fmt(*row["stats"][k], len(row["seeds"]), key=k) for k, _ in keys],
                     fmt(row["collapsed_gate"], None),
                     _pareto_text(row.get("pareto"))]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def seeds_text(seeds: list, separator: str, unseeded: str = "–") -> str:
    """A row's seeds; a reference row (no seed) as `unseeded` ("–" in tables, empty in CSV)."""
    return separator.join(unseeded if seed is None else str(seed) for seed in seeds)


def _pareto_text(flag) -> str:
    return {True: "yes", False: "no"}.get(flag, "–")


def to_csv(rows: list[dict], x: str | None = None) -> str:
    keys = list(dict.fromkeys(k for r in rows for k, _ in study_keys(r["benchmark"])))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["block", "benchmark", "variant", *([x] if x else []), "seeds", "n_seeds",
                     *[f"{k}_{s}" for k in keys for s in ("mean", "sd")], "collapsed_gate", "pareto_front"])
    for row in rows:
        values = []
        for key in keys:
            mean, sd, _ = row["stats"].get(key, (None, None, 0))
            values += ["" if mean is None else mean, "" if sd is None else sd]
        writer.writerow([row["block"], row["benchmark"], row["label"], *([row["x"]] if x else []),
                         seeds_text(row["seeds"], " ", unseeded=""), len(row["seeds"]), *values,
                         "" if row["collapsed_gate"] is None else row["collapsed_gate"],
                         {True: "true", False: "false"}.get(row.get("pareto"), "")])
    return out.getvalue()


def _errorbar(ax, xs, stats_list, **kwargs):
    points = [(x, s[0], s[1] or 0.0) for x, s in zip(xs, stats_list) if s[0] is not None]
    if points:
        px, py, pe = zip(*points)
        ax.errorbar(px, py, yerr=pe, capsize=3, marker="o", **kwargs)


def tradeoff_figure(block_rows: list[dict], *, title: str, block: str):
    """One block's forget vs utility figure: every variant and reference that has both (± sd over seeds), each
    labelled beside its point where the axes leave room and, always, in a legend beside the axes (many CRU
    variants collapse onto one spot, where labels cannot all fit)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..reporting.plots import distinct_colors, label_points, pad_limits

    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    drawn = []
    for row in block_rows:
        f, fs, _ = row["stats"]["forgetting"] if "forgetting" in row["stats"] else (None, None, 0)
        u, us, _ = row["stats"]["utility"] if "utility" in row["stats"] else (None, None, 0)
        if f is not None and u is not None:
            drawn.append((row, f, fs, u, us))
    for (row, f, fs, u, us), color in zip(drawn, distinct_colors(len(drawn))):
        ax.errorbar([f], [u], xerr=[fs or 0.0], yerr=[us or 0.0], marker="s" if row["label"] in
                    REFERENCE_ROWS else "o", capsize=3, linestyle="none", color=color, label=row["label"])
    ax.set_xlabel("forgetting (TOFU: 1 - forget ROUGE-L; RWKU: 1 - forget All)")
    ax.set_ylabel("utility (TOFU: MU; RWKU: mean utility)")
    ax.set_title(f"{title}\n{block}", fontsize=9)
    pad_limits(ax)
    fig.tight_layout()
    label_points(ax, [(f, u, row["label"]) for row, f, _, u, _ in drawn])
    if drawn:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)
    return fig


def plot_study(rows: list[dict], out_dir: Path, *, title: str, x: str | None = None,
               collapse_line: bool = False) -> list[Path]:
    """Per block: forget vs utility (`tradeoff_figure`); with `x`, the metrics and gate means along x (the CRU
    rows), and with `collapse_line` the collapsed router's 1 - 1/(2 lam)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..reporting.plots import file_slug, save_figure

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for block in dict.fromkeys(r["block"] for r in rows):
        block_rows = [r for r in rows if r["block"] == block]
        fig = tradeoff_figure(block_rows, title=title, block=block)
        path = out_dir / f"tradeoff_{file_slug(block)}.png"
        save_figure(fig, path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
        swept = sorted((r for r in block_rows if is_number(r["x"])), key=lambda r: r["x"])
        if x and swept:
            fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
            xs = [r["x"] for r in swept]
            for key, name in (("forgetting", "forgetting"), ("utility", "utility")):
                _errorbar(left, xs, [r["stats"][key] for r in swept], label=name)
            left.set_xlabel(AXIS_NAMES.get(x, x))
            left.legend(fontsize=8)
            left.set_title("forget and utility", fontsize=9)
            for key, name in (("gate_forget", "forget gate"), ("gate_retain", "retain gate")):
                _errorbar(right, xs, [r["stats"][key] for r in swept], label=name)
            if collapse_line:  # the swept rows' loss shape (the lambda study: the paper's)
                shape = loss_shape(swept[0])
                grid = np.geomspace(min(xs), max(xs), 200) if min(xs) > 0 else np.linspace(min(xs), max(xs), 200)
                paper = shape == {"suppress_loss": "linear", "pass_loss": "quadratic"}
                name = "collapsed router" + (" (paper loss: 1 - 1/(2λ))" if paper else "")
                right.plot(grid, [collapsed_gate(float(v), **shape) for v in grid], "k--", linewidth=1, label=name)
            right.set_xlabel(AXIS_NAMES.get(x, x))
            right.set_ylim(-0.02, 1.02)
            right.legend(fontsize=8)
            right.set_title("mean gates", fontsize=9)
            if min(xs) > 0 and max(xs) / min(xs) >= 20:   # lambda, learning rates: decades apart
                left.set_xscale("log")
                right.set_xscale("log")
            fig.suptitle(f"{title} · {block}", fontsize=9)
            fig.tight_layout()
            path = out_dir / f"sweep_{file_slug(block)}.png"
            save_figure(fig, path, dpi=120)
            plt.close(fig)
            paths.append(path)
    return paths
