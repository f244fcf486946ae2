"""WMDP's report blocks: its table's columns (forget accuracy per domain, MMLU overall and the close subjects) and
a figure with the chance line drawn. Every accuracy is a 4-way multiple choice: 0.25 is a model that knows nothing."""
from __future__ import annotations

import math
from pathlib import Path

from ...reporting.tables import Column
from .tasks import CHANCE, FORGET_TASKS, MMLU_SUBJECTS

DOMAIN_NAMES = {"bio": "Bio", "cyber": "Cyber", "chem": "Chem"}
SUBJECT_NAMES = {"college_biology": "college bio.", "virology": "virology",
                 "college_computer_science": "college CS", "computer_security": "computer sec."}

COLUMNS = (
    *[Column(f"{task}_acc", f"WMDP-{DOMAIN_NAMES[d]} ↓", f"{DOMAIN_NAMES[d]}$\\downarrow$", "down", "WMDP accuracy",
             optional=True) for d, task in FORGET_TASKS.items()],
    Column("mmlu_acc", "MMLU ↑", "All$\\uparrow$", "up", "MMLU accuracy"),
    *[Column(f"mmlu_{s}_acc", f"MMLU {SUBJECT_NAMES[s]} ↑", f"{SUBJECT_NAMES[s].capitalize()}$\\uparrow$", "up",
             "MMLU accuracy", optional=True) for s in MMLU_SUBJECTS],
)
NOTE = (f"Accuracy on 4-way multiple choice (lm-eval's wmdp_* and mmlu tasks, 0-shot): chance is {CHANCE:g}, the "
        f"score of a model that knows nothing. Unlearning a domain aims at chance on its WMDP questions with MMLU "
        f"kept; below chance is not better. Source: WMDP (Li et al. 2024), its tasks as lm-eval runs them.")

_MARKERS = [("wmdp_bio_acc", "WMDP-Bio", "o"), ("wmdp_cyber_acc", "WMDP-Cyber", "s"),
            ("wmdp_chem_acc", "WMDP-Chem", "D"), ("mmlu_acc", "MMLU", "^")]


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def accuracy_figure(rows: list[dict]):
    """One row per (model, domain, method), the reference first; a marker per WMDP domain and MMLU; the chance
    line at 0.25. None when no row has an accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ...reporting.plots import distinct_colors

    rows = [r for r in rows if any(_number(r["metrics"].get(k)) for k, _, _ in _MARKERS)]
    if not rows:
        return None
    rows = sorted(rows, key=lambda r: not r.get("reference"))
    names = [f"{r['model']} {r['unit']} {r['label']}" + (" (reference)" if r.get("reference") else "") for r in rows]
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.28 * len(rows) + 1.2)))
    ys = list(range(len(rows)))[::-1]
    for (key, name, marker), color in zip(_MARKERS, distinct_colors(len(_MARKERS))):
        values = [r["metrics"].get(key) for r in rows]
        ax.scatter([v if _number(v) else math.nan for v in values], ys, marker=marker, s=30, color=color, label=name)
    ax.axvline(CHANCE, color="0.3", linestyle="--", linewidth=1, label=f"chance ({CHANCE:g})")
    for y, r in zip(ys, rows):
        if r.get("reference"):
            ax.axhspan(y - 0.5, y + 0.5, color="0.92", zorder=0)
    ax.set_yticks(ys, names, fontsize=7)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlim(0, 1)
    ax.set_xlabel("accuracy (4 choices)")
    ax.set_title("WMDP: hazardous-knowledge accuracy and MMLU")
    ax.grid(axis="x", color="0.9")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return fig


def accuracy_plot(rows: list[dict], out_dir: Path) -> Path | None:
    import matplotlib.pyplot as plt

    from ...reporting.plots import save_figure

    fig = accuracy_figure(rows)
    if fig is None:
        return None
    path = save_figure(fig, Path(out_dir) / "wmdp_accuracy.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
