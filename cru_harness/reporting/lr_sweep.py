"""The baselines' one learning rate, chosen by the rule stated in configs/gpu_smollm2_lr.yaml (TOFU) and
configs/cpu_smollm2_rwku_lr.yaml (RWKU) before any number existed, so the choice is computed from the sweep's
cells rather than read off a table by eye.

Rule, per (model, split or target) block where some baseline ran at two or more learning rates: for each
learning rate, the median over the baselines of their kept-knowledge score (each method's mean over its seeds);
the chosen learning rate is the largest whose median is >= `RATIO` x the Original model's score, else the smallest
of the grid. The score is TOFU's Model Utility, and on RWKU the mean neighbour ROUGE-L recall (FB and QA: what must
survive next to the target; the shared RWKU copy has utility sets for targets 1-10 only, and a sweep runs on a
target the report never scores). Forget metrics are never read.
"""
from __future__ import annotations

import statistics
from collections import defaultdict

from .. import plugins
from .stats import finite_mean, is_number

RATIO = 0.9


def kept_score(result: dict) -> float | None:
    """The score the rule reads (`Benchmark.kept_score`): TOFU's MU; RWKU's neighbour FB / QA mean (None unless
    both are numbers)."""
    return plugins.benchmarks.get(result.get("benchmark")).kept_score(result)


def _rule_applies(benchmark) -> bool:
    return benchmark in plugins.benchmarks and plugins.benchmarks.get(benchmark).kept_score_name is not None


def baseline_methods() -> tuple[str, ...]:
    """The methods the rule covers: every registered method that trains the model's own weights."""
    return tuple(m.name for m in plugins.methods if m.trains and not m.adapter)


def sweep_choices(results: list[dict], ratio: float = RATIO) -> list[dict]:
    """One entry per block with a learning-rate sweep: the grid's rows and the chosen learning rate. An entry's
    `split` is the TOFU split or, on RWKU, `target<N>`; `original_score` / `median_score` hold the block's score
    (`score` names it: TOFU's MU or RWKU's neighbour score)."""
    originals: dict[tuple, float] = {}
    by_lr: dict[tuple, dict[float, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    baselines = baseline_methods()
    for r in results:
        if not _rule_applies(r.get("benchmark")) or r.get("status") != "ok":
            continue
        unit = plugins.benchmarks.get(r["benchmark"]).unit_label(r.get("split"), r.get("target"))
        block = (r["model"], r["benchmark"], unit)
        score = kept_score(r)
        if r.get("kind") == "original" and score is not None:
            originals[block] = score
        lr = (r.get("hparams") or {}).get("learning_rate")
        if r.get("kind") == "method" and r.get("method") in baselines and is_number(lr) and score is not None:
            by_lr[block][float(lr)][r["method"]].append(score)
    choices = []
    for block in sorted(by_lr, key=lambda b: (b[0], b[1], str(b[2]))):
        grid = by_lr[block]
        methods_seen = sorted({m for per_method in grid.values() for m in per_method})
        if sum(map(len, grid.values())) == len(methods_seen):
            continue  # no method at two learning rates (one rate, or each method at its own: a tuned run): no sweep
        original = originals.get(block)
        entry = {"model": block[0], "benchmark": block[1], "split": block[2],
                 "score": plugins.benchmarks.get(block[1]).kept_score_name,
                 "original_score": original, "ratio": ratio, "rows": [], "chosen": None, "reason": None}
        for lr in sorted(grid):
            means = {m: finite_mean(v) for m, v in grid[lr].items()}
            median = statistics.median(means.values())
            entry["rows"].append({"learning_rate": lr, "median_score": median, "methods": sorted(means),
                                  "missing": [m for m in methods_seen if m not in means],
                                  "qualifies": None if original is None else median >= ratio * original})
        if original is None:
            entry["reason"] = "no finished Original cell: the threshold is unknown"
        else:
            qualifying = [row["learning_rate"] for row in entry["rows"] if row["qualifies"]]
            if qualifying:
                entry["chosen"], entry["reason"] = max(qualifying), "the largest learning rate that qualifies"
            else:
                entry["chosen"] = entry["rows"][0]["learning_rate"]
                entry["reason"] = "no learning rate qualifies: the smallest of the grid"
        choices.append(entry)
    return choices


def sweep_markdown(results: list[dict], ratio: float = RATIO) -> list[str]:
    """Report lines for `sweep_choices` (none when the run has no learning-rate sweep)."""
    lines: list[str] = []
    for entry in sweep_choices(results, ratio):
        original = entry["original_score"]
        threshold = "--" if original is None else f"{ratio:g} x {original:.4f} = {ratio * original:.4f}"
        short = plugins.benchmarks.get(entry["benchmark"]).kept_score_short
        lines += [f"### Learning-rate sweep: {entry['model']} {entry['split']}", "",
                  "The baselines' one learning rate (rule of cru_harness.reporting.lr_sweep, stated in the sweep's "
                  f"config): the largest whose median {entry['score']} over the baselines is >= {ratio:g} x "
                  f"Original's (threshold {threshold}); forget metrics are not read.", "",
                  f"| Learning rate | Median {short} | Qualifies | Methods | Missing |", "|---:|---:|---|---|---|"]
        for row in entry["rows"]:
            verdict = {True: "yes", False: "no", None: "--"}[row["qualifies"]]
            lines.append(f"| {row['learning_rate']:g} | {row['median_score']:.4f} | {verdict} | "
                         f"{', '.join(row['methods'])} | {', '.join(row['missing']) or '--'} |")
        chosen = "none" if entry["chosen"] is None else f"**{entry['chosen']:g}**"
        lines += ["", f"Chosen: {chosen} ({entry['reason']}).", ""]
    return lines
