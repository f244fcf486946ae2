"""The CRU routers' learning rate, chosen by the rule stated in configs/studies/router_lr_cpu.yaml (and
router_lr.yaml) before any number existed, so the choice is computed from the sweep's cells rather than read off a
table by eye.

A learning rate is an optimiser setting, so the rule judges it by the objective it optimises and never reads an
evaluation metric. A cell's objective is the paper's loss (`cru.losses.cru_loss`, with the cell's lambda and loss
shapes) on its bundle's final per-block gate means (eval mode: the whole forget corpus and the retain rows training
drew). Per block of CRU cells that differ only in `lr` (same model, benchmark, unit and other hyperparameters) and
that hold two or more learning rates: for each learning rate the median over seeds; the chosen one has the lowest
median, an exact tie going to the smaller. A cell without finite per-block gate means (failed, diverged) counts as
missing, listed, and as an infinite objective in its rate's median: never as a low one. A choice at an end of the
grid says so. A cell's learning rate is the one its config gave or its routers recorded, never today's default.
Results do not record the corpora, so two labels at one learning rate (e.g. another retain corpus) make the block
no sweep of `lr` alone: it is listed, and nothing is chosen.
"""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict

from .. import plugins


def _setting(result: dict, name: str):
    """A CRU cell's training setting: as its config gave it (hparams), else as its routers recorded it
    (`details.router_training`, cells computed since the record exists), else None."""
    hparams = result.get("hparams") or {}
    if name in hparams:
        return hparams[name]
    return ((result.get("details") or {}).get("router_training") or {}).get(name)


def cru_setting(result: dict, name: str):
    """A CRU cell's (or a study row's: anything with `hparams`) training setting `name`: given, else recorded
    (`_setting`), else `RouterTrainingConfig`'s default. The one lookup for readers of finished cells that need
    a value (the loss, the collapsed-router gate); `trained_lr` never guesses instead."""
    value = _setting(result, name)
    if value is not None:
        return value
    from dataclasses import fields

    from ..cru.train import RouterTrainingConfig

    return next(f.default for f in fields(RouterTrainingConfig) if f.name == name)


def trained_lr(result: dict) -> float | None:
    """The learning rate a CRU cell's routers trained at, or None where neither its config nor its record says
    (a cell from before the record, trained at whatever the default then was: never guessed from today's)."""
    value = _setting(result, "lr")
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def objective(result: dict) -> float | None:
    """The paper's loss on a CRU cell's final per-block gate means, or None where they are missing or not finite."""
    import torch

    from ..cru.losses import LOSS_SHAPES, cru_loss

    raw = (result.get("gate_means") or {}).get("raw") or {}
    forget, retain = raw.get("forget_gate_mean_per_block"), raw.get("retain_gate_mean_per_block")
    if not isinstance(forget, dict) or not isinstance(retain, dict) or not forget or set(forget) != set(retain):
        return None
    values = list(forget.values()) + list(retain.values())
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        return None
    setting = {name: cru_setting(result, name) for name in ("lam", "suppress_loss", "pass_loss")}
    if not isinstance(setting["lam"], (int, float)) or {setting["suppress_loss"], setting["pass_loss"]} - set(LOSS_SHAPES):
        return None
    as_tensors = lambda means: {block: torch.tensor(float(v), dtype=torch.float64) for block, v in means.items()}
    return float(cru_loss(as_tensors(forget), as_tensors(retain), float(setting["lam"]),
                          suppress_loss=setting["suppress_loss"], pass_loss=setting["pass_loss"]))


def _block_key(result: dict) -> tuple:
    hparams = {k: v for k, v in (result.get("hparams") or {}).items() if k != "lr"}
    unit = plugins.benchmarks.get(result.get("benchmark")).unit_label(result.get("split"), result.get("target"))
    return (str(result.get("model")), str(result.get("benchmark")), str(unit),
            json.dumps(hparams, sort_keys=True, default=str))


def _routes(method) -> bool:
    """Whether a registered method trains router bundles on a frozen base (`Method.adapter`: CRU)."""
    from .. import plugins

    return method in plugins.methods and plugins.methods.get(method).adapter


def router_lr_choices(results: list[dict]) -> list[dict]:
    """One entry per block of CRU cells swept over `lr` alone: the grid's rows and the chosen learning rate. A
    seed whose cell failed or diverged counts as an infinite objective in its learning rate's median, so a rate
    is never chosen on the seeds that survived it."""
    grids: dict[tuple, dict[float, dict]] = defaultdict(
        lambda: defaultdict(lambda: {"values": [], "missing": [], "labels": set()}))
    unrecorded: dict[tuple, int] = defaultdict(int)
    for r in results:
        if r.get("kind") != "method" or not _routes(r.get("method")):
            continue
        lr = trained_lr(r)
        if lr is None:
            unrecorded[_block_key(r)] += 1
            continue
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
                 "rows": [], "chosen": None, "reason": None, "unrecorded": unrecorded.get(key, 0)}
        for lr in sorted(grid):
            values, missing = grid[lr]["values"], grid[lr]["missing"]
            median = statistics.median(values + [math.inf] * len(missing)) if values or missing else math.inf
            entry["rows"].append({"lr": lr, "median_objective": median if math.isfinite(median) else None,
                                  "seeds": len(values), "missing": sorted(missing, key=str)})
        scored = [row for row in entry["rows"] if row["median_objective"] is not None]
        mixed = {lr: sorted(map(str, slot["labels"])) for lr, slot in grid.items() if len(slot["labels"]) > 1}
        if mixed:
            lr, labels = min(mixed.items())
            entry["reason"] = (f"learning rate {lr:g} holds several labels ({', '.join(labels)}): the cells differ "
                               "in more than the learning rate")
        elif not scored:
            entry["reason"] = "no learning rate has a finite median objective"
        else:   # rows are in ascending lr, so min() keeps the smaller learning rate on an exact tie
            entry["chosen"] = min(scored, key=lambda row: row["median_objective"])["lr"]
            entry["reason"] = "the lowest median objective"
            if entry["chosen"] in (entry["rows"][0]["lr"], entry["rows"][-1]["lr"]):
                side = "largest" if entry["chosen"] == entry["rows"][-1]["lr"] else "smallest"
                entry["reason"] += f"; the {side} rate of the grid: one beyond it was not tried"
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
        lines += ["", f"Chosen: {chosen} ({entry['reason']})."]
        if entry["unrecorded"]:
            lines.append(f"{entry['unrecorded']} CRU cell(s) of this block record no learning rate (computed before "
                         "results recorded it, at a default since changed or not): left out.")
        lines.append("")
    return lines
