"""TOFU's own report block (`TOFU.report_lines`): the regime check, after its leaderboard."""
from __future__ import annotations

from collections import defaultdict

from ... import plugins
from ...reporting import stats
from ...reporting.tables import fmt2

REGIME_MARGIN = 0.10  # configs/gpu_smollm2.yaml: the fine-tuned model must beat its oracle by this much


def regime_check(results: list[dict]) -> list[dict]:
    """Per TOFU (model, split): the Original (fine-tuned) model's forget ROUGE-L and Prob. against its Retain
    oracle's. TOFU measures unlearning only where the model knows the forget authors better than a model that
    never saw them; `holds` says whether Original exceeds Retain by `REGIME_MARGIN` in forget ROUGE-L."""
    found: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in results:
        if r.get("kind") in ("original", "retain") and r.get("status") == "ok" and \
                plugins.benchmarks.get(r.get("benchmark")).has_oracle:
            found[(r["model"], r.get("split"))][r["kind"]] = r.get("metrics") or {}
    rows = []
    for (model, split), kinds in sorted(found.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        original, retain = kinds.get("original", {}), kinds.get("retain", {})
        o_rouge, r_rouge = original.get("forget_rouge_l"), retain.get("forget_rouge_l")
        gap = o_rouge - r_rouge if stats.is_number(o_rouge) and stats.is_number(r_rouge) else None
        rows.append({"model": model, "split": split, "original_rouge_l": o_rouge, "retain_rouge_l": r_rouge,
                     "original_prob": original.get("forget_prob"), "retain_prob": retain.get("forget_prob"),
                     "gap": gap, "holds": None if gap is None else gap >= REGIME_MARGIN})
    return rows


def regime_check_markdown(results: list[dict]) -> list[str]:
    """Report lines for `regime_check` (none when no TOFU block has an Original or Retain cell)."""
    rows = regime_check(results)
    if not rows:
        return []
    lines = ["### Regime check: does the model know the forget authors better than its retain oracle?", "",
             f"Forget-set scores of the model before unlearning (Original) and of its retain oracle (Retain). The "
             f"check holds where Original's forget ROUGE-L exceeds Retain's by at least {REGIME_MARGIN:.2f}; where "
             "it does not, there is little to unlearn and Forget Quality says little.", "",
             "| Model | Split | Original ROUGE-L | Retain ROUGE-L | Gap | Original Prob. | Retain Prob. | Check |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        verdict = {True: "holds", False: "**fails**", None: "--"}[row["holds"]]
        lines.append(f"| {row['model']} | {row['split']} | {fmt2(row['original_rouge_l'])} | "
                     f"{fmt2(row['retain_rouge_l'])} | {fmt2(row['gap'])} | {fmt2(row['original_prob'])} | "
                     f"{fmt2(row['retain_prob'])} | {verdict} |")
    return lines + [""]
