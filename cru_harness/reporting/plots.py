"""Report figures (PNG, matplotlib's Agg backend; no display needed).

- tradeoff_<benchmark>_<model>_<unit>.png: Utility vs Forgetting per (model, split) with the Pareto front; the
  original model as an open circle, dominated methods as crosses; labels placed apart (`label_points`); a dotted
  chance line where the benchmark declares one (`chance_forgetting`).
- gates.png: CRU's mean gate on forget vs retain inputs, per cell group.
- resources.png: wall time (the cell's, its training part over it) and peak memory per method.
Legends sit beside the axes: inside, with the many methods of a report, they covered the data.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .. import plugins  # noqa: E402
from . import stats  # noqa: E402
from .tables import peak_memory_bytes  # noqa: E402


def save_figure(fig, path: str | Path, **kwargs) -> Path:
    """`fig.savefig(path, **kwargs)` through a temporary file renamed into place: a killed report never leaves
    half a PNG under the real name."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.partial{path.suffix}")   # same suffix: savefig reads the format from it
    try:
        fig.savefig(tmp, **kwargs)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def file_slug(text: str) -> str:
    """`text` as a file-name part: each run of characters other than letters, digits, `_`, `.` and `-` -> `_`."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("_")


def distinct_colors(count: int) -> list:
    """`count` colours, none repeated (matplotlib's default cycle repeats after 10)."""
    if count <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(count)]
    if count <= 20:
        # tab20 holds each tab10 colour and a light shade of it: all the strong ones first, then the light ones
        return [plt.get_cmap("tab20")((2 * i) % 20 + (i % 20) // 10) for i in range(count)]
    # more than the qualitative maps hold: evenly spaced hues, which stay apart but lose tab20's contrast
    return [plt.get_cmap("hsv")(i / count) for i in range(count)]


def label_points(ax, points: list[tuple[float, float, str]], *, fontsize: float = 7) -> list:
    """Annotate each (x, y, label) so that no label overlaps another label or a marked point, where the axes
    leave room. Each label takes the first free spot among those around its point, then farther above or below
    it, joined to its point by a thin line (deterministic: points with the same data get the same labels).
    Call it once every point is drawn and the axis limits are final."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    to_px = fig.dpi / 72.0
    frame = ax.get_window_extent(renderer)
    centres = [tuple(ax.transData.transform((x, y))) for x, y, _ in points]
    pad, marker = 1.0 * to_px, 4.0 * to_px          # gap between labels; half a marker's size

    def free(box) -> bool:
        x0, y0, x1, y1 = box
        if x0 < frame.x0 or x1 > frame.x1 or y0 < frame.y0 or y1 > frame.y1:
            return False
        if any(x0 < b[2] + pad and b[0] < x1 + pad and y0 < b[3] + pad and b[1] < y1 + pad for b in placed):
            return False
        return not any(x0 - marker < cx < x1 + marker and y0 - marker < cy < y1 + marker for cx, cy in centres)

    placed, texts = [], []
    for index in sorted(range(len(points)), key=lambda i: (-points[i][1], points[i][0], points[i][2])):
        x, y, label = points[index]
        text = ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 2), fontsize=fontsize,
                           ha="left", va="bottom")
        extent = text.get_window_extent(renderer)
        w, h = extent.width / to_px, extent.height / to_px          # in points
        right, left = 4.0, -4.0 - w
        spots = [(right, 2.0), (right, -2.0 - h), (left, 2.0), (left, -2.0 - h)]
        for k in range(1, 16):   # farther away, nearest first
            step = k * (h + 1.0)
            spots += [(right, 2.0 + step), (right, -2.0 - h - step), (left, 2.0 + step), (left, -2.0 - h - step)]
        cx, cy = centres[index]

        def box(spot):   # the label's pixel box with its lower-left corner at `spot` (points from its point)
            return (cx + spot[0] * to_px, cy + spot[1] * to_px,
                    cx + (spot[0] + w) * to_px, cy + (spot[1] + h) * to_px)

        chosen = next((spot for spot in spots if free(box(spot))), spots[0])
        text.xyann = chosen
        if chosen not in spots[:4]:
            ax.annotate("", (x, y), xytext=(chosen[0] + (0 if chosen[0] > 0 else w), chosen[1] + h / 2),
                        textcoords="offset points", arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.5"})
        placed.append(box(chosen))
        texts.append(text)
    return texts


def pad_limits(ax, fraction: float = 0.08) -> None:
    """Room around the points for their labels (fixes the limits, which `label_points` needs final)."""
    for get, set_ in ((ax.get_xlim, ax.set_xlim), (ax.get_ylim, ax.set_ylim)):
        low, high = get()
        span = (high - low) or 1.0
        set_(low - fraction * span, high + fraction * span)


def tradeoff_plots(rows: list[dict], benchmark: str, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    blocks: dict[tuple, list[dict]] = {}
    for row in rows:
        blocks.setdefault((row["model"], row["unit"]), []).append(row)
    for (model, unit), block in blocks.items():
        points = [(r, r["metrics"].get("forgetting"), r["metrics"].get("utility")) for r in block]
        points = [(r, x, y) for r, x, y in points if stats.is_number(x) and stats.is_number(y)]
        if not points:
            continue
        fig, ax = plt.subplots(figsize=(6.5, 4))
        competitors = {r["label"]: (x, y) for r, x, y in points if not r["reference"]}
        spread = False
        flags = stats.pareto_dominated(competitors)
        colors = iter(distinct_colors(len(competitors)))
        for r, x, y in points:
            if r["reference"]:
                ax.scatter([x], [y], facecolors="none", edgecolors="black", s=70, label=f"{r['label']} (reference)")
            else:
                color = next(colors)
                ax.scatter([x], [y], s=50, marker="o" if not flags[r["label"]] else "x", color=color,
                           label=r["label"] + ("" if not flags[r["label"]] else " (dominated)"))
                sd = r.get("metrics_sd") or {}   # over seeds; a row of one seed has none
                if sd.get("forgetting") is not None or sd.get("utility") is not None:
                    spread = True
                    ax.errorbar([x], [y], xerr=[sd.get("forgetting") or 0.0], yerr=[sd.get("utility") or 0.0],
                                fmt="none", ecolor=color, elinewidth=0.8, capsize=2)
        front = sorted((xy for label, xy in competitors.items() if not flags[label]), key=lambda p: p[0])
        if len(front) > 1:
            # the edge of what the front dominates: down from each point, then across to the next ("post" would
            # run through the undominated corner beyond each point)
            ax.step([p[0] for p in front], [p[1] for p in front], where="pre", linestyle="--", color="grey",
                    label="Pareto front")
        plugin = plugins.benchmarks.get(benchmark)
        if plugin.chance_forgetting is not None:   # a model that knows nothing (WMDP: chance accuracy)
            ax.axvline(plugin.chance_forgetting, linestyle=":", color="black", linewidth=1,
                       label=f"chance ({plugin.chance_forgetting:g})")
        x_label, y_label = plugin.axis_labels
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        # the front is drawn through the means: the bars show how far a seed moves a point
        ax.set_title(f"{benchmark.upper()} {model} {unit}" + ("\nmeans over seeds, bars: ± 1 sd" if spread else ""))
        # outside the axes: inside, it hid the points under it
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
        pad_limits(ax)
        fig.tight_layout()
        label_points(ax, [(x, y, r["label"]) for r, x, y in points])
        path = out_dir / f"tradeoff_{benchmark}_{file_slug(model)}_{file_slug(unit)}.png"
        save_figure(fig, path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def gate_figure(rows: list[dict]):
    """CRU's mean gate on forget and on retain inputs, one pair of bars per CRU row; None without gates."""
    items = [(f"{r['model']} {r['unit']} {r['label']}", r["gate_means"]) for r in rows if r.get("gate_means")]
    items = [(name, g) for name, g in items if stats.is_number(g.get("forget")) or stats.is_number(g.get("retain"))]
    if not items:
        return None
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(items)), 3.5))
    xs = range(len(items))
    def mean(gates: dict, key: str) -> float:   # a missing mean draws no bar (a bar of 0 would read as shut gates)
        return gates[key] if stats.is_number(gates.get(key)) else math.nan

    ax.bar([x - 0.2 for x in xs], [mean(g, "forget") for _, g in items], width=0.4, label="forget inputs")
    ax.bar([x + 0.2 for x in xs], [mean(g, "retain") for _, g in items], width=0.4, label="retain inputs")
    ax.set_xticks(list(xs), [name for name, _ in items], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("mean gate")
    ax.set_ylim(0, 1.05)
    ax.set_title("CRU gates: forget vs retain")
    # outside the axes: inside, it hid the bars of gates near 1
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return fig


def gate_plot(rows: list[dict], out_dir: Path) -> Path | None:
    return _write(gate_figure(rows), out_dir / "gates.png")


def _write(fig, path: Path) -> Path | None:
    if fig is None:
        return None
    save_figure(fig, path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


#: `_write` for a benchmark's own figures (`Benchmark.plots`: benchmarks/rwku/report.py)
write_figure = _write


def resources_figure(results: list[dict]):
    """Per method: the cell's wall time with its training part drawn over it (a method that does not train,
    such as ICU, has only the cell's bar), and the peak memory. Horizontal bars: the method names stay
    readable however many there are."""
    groups: dict[str, list[dict]] = {}
    for r in results:
        if r.get("kind") == "method" and r.get("status") == "ok":
            groups.setdefault(f"{r['benchmark']} {r['label']}", []).append(r.get("resources") or {})
    if not groups:
        return None
    labels = sorted(groups, reverse=True)   # barh draws from the bottom up: this reads A..Z from the top
    def mean_of(key):
        return [stats.finite_mean(i.get(key) for i in groups[label]) for label in labels]

    cells, trains = mean_of("cell_wall_time_s"), mean_of("train_wall_time_s")
    memory = [(stats.finite_mean(peak_memory_bytes(i) for i in groups[label]) or math.nan) / 2**20
              for label in labels]
    ys = range(len(labels))
    fig, (a, b) = plt.subplots(1, 2, sharey=True, figsize=(10, max(2.5, 0.28 * len(labels) + 1.2)))
    a.barh(ys, [c if c is not None else math.nan for c in cells], color="tab:blue", alpha=0.35, label="whole cell")
    a.barh(ys, [t if t else math.nan for t in trains], height=0.5, color="tab:blue", label="training")
    a.set_xlabel("wall time (s)")
    a.legend(fontsize=7, loc="lower right")
    b.barh(ys, memory, color="tab:orange")
    b.set_xlabel("peak memory (MiB)")
    a.set_yticks(list(ys), labels, fontsize=7)
    fig.suptitle("Resources per method (mean over its cells)", fontsize=10)
    fig.tight_layout()
    return fig


def resources_plot(results: list[dict], out_dir: Path) -> Path | None:
    return _write(resources_figure(results), out_dir / "resources.png")


def robustness_figure(rows: list[dict]):
    """Recovery per attacked row (one marker per attack), the oracle's change on the same scale as a hollow marker
    beside it: a method whose markers sit right of its oracle's hid what it was asked to remove."""
    from ..metrics.recovery import share_shown

    # a share of a gap under the report's minimum is not drawn, as the table prints none
    rows = [r for r in rows if r["recovery"] is not None and r["recovery"].score is not None
            and share_shown(r["recovery"].gap)]
    if not rows:
        return None
    names = list(dict.fromkeys(f"{r['model']} {r['unit']} {r['label']}" for r in rows))
    attacks = list(dict.fromkeys(r["attack"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.3 * len(names) + 1.2)))
    ys = {name: y for y, name in zip(range(len(names))[::-1], names)}
    for attack, color in zip(attacks, distinct_colors(len(attacks))):
        mine = [r for r in rows if r["attack"] == attack]
        at = [ys[f"{r['model']} {r['unit']} {r['label']}"] for r in mine]
        held_out = any(r["items"] == "held-out" for r in mine)   # relearn: read on the items it did not train on
        bounds = [(r.get("intervals") or {}).get("score") for r in mine]   # item-bootstrap intervals, if any
        ax.errorbar([r["recovery"].score for r in mine], at, fmt="none", ecolor=color, elinewidth=0.8,
                    xerr=[[r["recovery"].score - b[0] if b else 0 for r, b in zip(mine, bounds)],
                          [b[1] - r["recovery"].score if b else 0 for r, b in zip(mine, bounds)]])
        ax.scatter([r["recovery"].score for r in mine], at, color=color, s=30,
                   label=f"{attack} (held-out items)" if held_out else attack)
        oracle = [(r["recovery"].oracle_score, y) for r, y in zip(mine, at) if r["recovery"].oracle_score is not None]
        if oracle:
            ax.scatter([o for o, _ in oracle], [y for _, y in oracle], facecolors="none", edgecolors=color, s=30,
                       label=f"{attack} (oracle)")
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.axvline(1, color="grey", linewidth=0.8, linestyle="--")
    ax.set_yticks(list(ys.values()), list(ys), fontsize=7)
    ax.set_xlabel(f"Recovery of {rows[0]['metric']} (share of the Original-to-unlearned gap)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return fig


def robustness_plot(rows: list[dict], out_dir: Path, benchmark: str) -> Path | None:
    return _write(robustness_figure(rows), out_dir / f"robustness_{benchmark}.png")


def levels_figure(rows: list[dict]):
    """The headline reading (`tables.levels_rows`): per metric a panel, per robustness row the attacked level with
    its item-bootstrap interval (filled), the oracle's under the same attack (hollow) and the Original's under it
    (a cross); a filled marker right of its hollow one, beyond its bar, is knowledge that came back."""
    rows = [r for r in rows if stats.is_number(r.get("after"))]
    if not rows:
        return None
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    names = list(dict.fromkeys(f"{r['label']} + {r['attack']}" for r in rows))
    ys = {name: y for y, name in zip(range(len(names))[::-1], names)}
    fig, axes = plt.subplots(1, len(metrics), sharey=True, squeeze=False,
                             figsize=(3.2 * len(metrics) + 2, max(2.5, 0.18 * len(names) + 1.2)))
    for ax, metric in zip(axes[0], metrics):
        mine = [r for r in rows if r["metric"] == metric]
        for r in mine:
            y = ys[f"{r['label']} + {r['attack']}"]
            bounds = (r.get("intervals") or {}).get("after")
            if bounds:
                ax.plot(bounds, [y, y], color="tab:blue", linewidth=0.8)
            ax.scatter([r["after"]], [y], color="tab:blue", s=14)
            if stats.is_number(r.get("oracle_after")):
                ax.scatter([r["oracle_after"]], [y], facecolors="none", edgecolors="tab:green", s=14)
            if stats.is_number(r.get("original_after")):
                ax.scatter([r["original_after"]], [y], marker="x", color="tab:red", s=14)
        ax.set_title(f"forget {mine[0]['metric_name']}", fontsize=9)
        ax.set_xlim(-0.02, 1.02)
    axes[0][0].set_yticks(list(ys.values()), list(ys), fontsize=6)
    handles = [plt.Line2D([], [], color="tab:blue", marker="o", linestyle="-", label="attacked (interval)"),
               plt.Line2D([], [], color="tab:green", marker="o", markerfacecolor="none", linestyle="none",
                          label="oracle + attack"),
               plt.Line2D([], [], color="tab:red", marker="x", linestyle="none", label="Original + attack")]
    axes[0][-1].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return fig


def levels_plot(rows: list[dict], out_dir: Path, benchmark: str) -> Path | None:
    return _write(levels_figure(rows), out_dir / f"robustness_levels_{benchmark}.png")
