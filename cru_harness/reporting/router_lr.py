"""The CRU routers' learning rate, chosen by the rule stated in configs/studies/router_lr_cpu.yaml (and
router_lr.yaml) before any number existed, so the choice is computed from the sweep's cells rather than read off a
table by eye.

A learning rate is an optimiser setting, so the rule judges it by the objective it optimises and never reads an
evaluation metric. A cell's objective is the paper's loss (`cru.losses.cru_loss`, with the cell's lambda and loss
shapes) on its bundle's final per-block gate means (eval mode: the whole forget corpus and the retain rows training
drew). Per block of CRU cells that differ only in `lr` (same model, benchmark, unit and other hyperparameters) and
that hold two or more learning rates: for each learning rate the median over seeds; the chosen one has the lowest
median, an exact tie going to the smaller. A cell without finite per-block gate means (failed, diverged) counts as
missing and is listed, never as a low objective. Results do not record the corpora, so two labels at one learning
rate (e.g. another retain corpus) make the block no sweep of `lr` alone: it is listed, and nothing is chosen.
"""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict


def objective(result: dict) -> float | None:
    """The paper's loss on a CRU cell's final per-block gate means, or None where they are missing or not finite."""
    import torch

    from ..cru.losses import cru_loss
    from ..cru.train import RouterTrainingConfig

    raw = (result.get("gate_means") or {}).get("raw") or {}
    forget, retain = raw.get("forget_gate_mean_per_block"), raw.get("retain_gate_mean_per_block")
    if not forget or not retain:
        return None
    values = list(forget.values()) + list(retain.values())
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        return None
    config = RouterTrainingConfig(**(result.get("hparams") or {}))   # the defaults the cell trained with
    as_tensors = lambda means: {block: torch.tensor(float(v), dtype=torch.float64) for block, v in means.items()}
    return float(cru_loss(as_tensors(forget), as_tensors(retain), config.lam,
                          suppress_loss=config.suppress_loss, pass_loss=config.pass_loss))


def _block_key(result: dict) -> tuple:
    hparams = {k: v for k, v in (result.get("hparams") or {}).items() if k != "lr"}
    unit = result.get("split") if result.get("benchmark") == "tofu" else f"target{result.get('target')}"
    return result["model"], result["benchmark"], str(unit), json.dumps(hparams, sort_keys=True, default=str)


def router_lr_choices(results: list[dict]) -> list[dict]:
    """One entry per block of CRU cells swept over `lr` alone: the grid's rows and the chosen learning rate."""
    from ..cru.train import RouterTrainingConfig

    default_lr = RouterTrainingConfig.__dataclass_fields__["lr"].default
    grids: dict[tuple, dict[float, dict]] = defaultdict(lambda: defaultdict(lambda: {"values": [], "missing": [], "labels": set()}))
    for r in results:
        if r.get("kind") != "method" or r.get("method") != "CRU":
            continue
        lr = float((r.get("hparams") or {}).get("lr", default_lr))
        slot = grids[_block_key(r)][lr]
        slot["labels"].add(r.get("label"))
        value = objective(r) if r.get("status") == "ok" else None
        if value is None:
            slot["missing"].append(r.get("seed"))
        else:
            slot["values"].append(value)
    choices = []
    for key in sorted(grids):
        grid = grids[key]
        if len(grid) < 2:
            continue  # one learning rate: a run, not a sweep
        entry = {"model": key[0], "benchmark": key[1], "split": key[2], "hparams": json.loads(key[3]),
                 "rows": [], "chosen": None, "reason": None}
        for lr in sorted(grid):
            values = grid[lr]["values"]
            entry["rows"].append({"lr": lr, "median_objective": statistics.median(values) if values else None,
                                  "seeds": len(values), "missing": sorted(grid[lr]["missing"], key=str)})
        scored = [row for row in entry["rows"] if row["median_objective"] is not None]
        mixed = {lr: sorted(map(str, slot["labels"])) for lr, slot in grid.items() if len(slot["labels"]) > 1}
        if mixed:
            lr, labels = min(mixed.items())
            entry["reason"] = (f"learning rate {lr:g} holds several labels ({', '.join(labels)}): the cells differ "
                               "in more than the learning rate")
        elif not scored:
            entry["reason"] = "no learning rate has a finite objective"
        else:   # rows are in ascending lr, so min() keeps the smaller learning rate on an exact tie
            entry["chosen"] = min(scored, key=lambda row: row["median_objective"])["lr"]
            entry["reason"] = "the lowest median objective"
        choices.append(entry)
    return choices


def router_lr_markdown(results: list[dict]) -> list[str]:
    """Report lines for `router_lr_choices` (none when the run has no router learning-rate sweep)."""
    lines: list[str] = []
    for entry in router_lr_choices(results):
        lines += [f"### Router learning-rate sweep: {entry['model']} {entry['split']}", "",
                  "The CRU routers' learning rate (rule of cru_harness.reporting.router_lr, stated in the sweep's "
                  "config): the lowest median over seeds of the paper's loss on the final per-block gate means "
                  "(the objective the routers minimise, on their training rows); no evaluation metric is read.", "",
                  "| Learning rate | Median objective | Seeds | Missing seeds |", "|---:|---:|---:|---|"]
        for row in entry["rows"]:
            value = "--" if row["median_objective"] is None else f"{row['median_objective']:.4f}"
            missing = ", ".join(str(s) for s in row["missing"]) or "--"
            lines.append(f"| {row['lr']:g} | {value} | {row['seeds']} | {missing} |")
        chosen = "none" if entry["chosen"] is None else f"**{entry['chosen']:g}**"
        lines += ["", f"Chosen: {chosen} ({entry['reason']}).", ""]
    return lines
