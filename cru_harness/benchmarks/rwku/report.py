"""RWKU's own report blocks: the adversarial probe per attack type (`RWKU.report_lines`, after the robustness
table) and the forget score per probe level (`RWKU.plots`: rwku_levels.png)."""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from ...reporting import stats
from ...reporting.plots import distinct_colors, plt, write_figure
from ...reporting.tables import fmt2


def aa_type_rows(results: list[dict]) -> list[dict]:
    """RWKU's adversarial probe per attack type (`details.scoring.forget_aa_types` of each cell): per (model, row
    label), the ROUGE-L recall of each type over the row's items (targets and seeds pooled, item-weighted)."""
    pooled: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    for r in results:
        types = ((r.get("details") or {}).get("scoring") or {}).get("forget_aa_types")
        if r.get("status") != "ok" or not types or r.get("kind") in ("retain", "finetune"):
            continue
        for kind, value in types.items():
            if stats.is_number(value.get("rouge_l_recall")) and value.get("n"):
                total = pooled[(r["model"], r["label"])][kind]
                total[0] += value["rouge_l_recall"] * value["n"]
                total[1] += value["n"]
    return [{"model": model, "label": label, "types": {kind: (t[0] / t[1], t[1]) for kind, t in kinds.items()}}
            for (model, label), kinds in pooled.items()]


def aa_type_markdown(results: list[dict]) -> list[str]:
    """Report lines for `aa_type_rows` (none when no cell recorded RWKU's AA types)."""
    rows = aa_type_rows(results)
    if not rows:
        return []
    kinds = sorted({kind for row in rows for kind in row["types"]})
    lines = ["### Adversarial probes by attack type", "",
             "RWKU's AA probe (forget ROUGE-L recall, higher = more of the target known) per attack type, over the "
             "row's targets and seeds (item-weighted; n items per type in parentheses). A type that keeps much more "
             "than the others is a way around the unlearning (docs/protocol.md, Attacks: paraphrase).", "",
             "| Model | Method | " + " | ".join(kind or "(none)" for kind in kinds) + " |",
             "|---|---|" + "---:|" * len(kinds)]
    for row in rows:
        cells = [f"{fmt2(row['types'][k][0])} ({row['types'][k][1]})" if k in row["types"] else "" for k in kinds]
        lines.append(f"| {row['model']} | {row['label']} | " + " | ".join(cells) + " |")
    return lines + [""]


def rwku_level_figure(rows: list[dict]):
    """One row per method (the reference first), one marker per probe level: a dot plot stays readable with the
    twenty-odd methods of a report, where one line per method did not."""
    levels = [("forget_fb", "FB", "o"), ("forget_qa", "QA", "s"), ("forget_aa", "AA", "^")]
    rows = [r for r in rows if any(stats.is_number(r["metrics"].get(k)) for k, _, _ in levels)]
    if not rows:
        return None
    rows = sorted(rows, key=lambda r: not r["reference"])        # stable: the report's order otherwise
    names = [f"{r['model']} {r['label']}" + (" (reference)" if r["reference"] else "") for r in rows]
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.28 * len(rows) + 1.2)))
    ys = list(range(len(rows)))[::-1]                            # the first row on top
    for (key, name, marker), color in zip(levels, distinct_colors(len(levels))):
        values = [r["metrics"].get(key) for r in rows]
        ax.scatter([v if stats.is_number(v) else math.nan for v in values], ys, marker=marker, s=30,
                   facecolors="none" if marker != "o" else color, edgecolors=color, label=name)
    for y, r in zip(ys, rows):
        if r["reference"]:
            ax.axhspan(y - 0.5, y + 0.5, color="0.92", zorder=0)
    ax.set_yticks(ys, names, fontsize=7)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel("forget ROUGE-L recall (lower = more forgotten)")
    ax.set_title("RWKU forget score per probe level")
    ax.grid(axis="x", color="0.9")
    ax.legend(fontsize=7, title="probe level", title_fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0),
              borderaxespad=0.0)
    fig.tight_layout()
    return fig


def rwku_level_plot(rows: list[dict], out_dir: Path) -> Path | None:
    return write_figure(rwku_level_figure(rows), out_dir / "rwku_levels.png")
