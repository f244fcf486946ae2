"""`cru-harness run CONFIG`, `cru-harness merge DIR...`, `cru-harness demo`."""
from __future__ import annotations

import argparse
import importlib.resources
import json
import shutil
import sys
from pathlib import Path

# configs/ ships inside the package as cru_harness.configs, so the demo also runs from a wheel install.
DEMO_CONFIG = Path(importlib.resources.files("cru_harness.configs") / "demo.yaml")


def register(subparsers) -> None:
    run = subparsers.add_parser("run", help="run an experiment config (cells cached; resumes; --dry-run plans)",
                                description="Run every cell of an experiment config. Finished cells are skipped, "
                                            "an interrupted run resumes, and a report is written at the end.")
    run.add_argument("config", help="experiment YAML (see configs/ and docs/results_schema.md)")
    run.add_argument("--dry-run", action="store_true",
                     help="validate the config and print the cells (what is trained, downloaded, evaluated); "
                          "touches no model")
    run.add_argument("--shard", metavar="I/N", help="run only shard I of N (1-based; cells split by hash)")
    run.add_argument("--output-dir", help="override the config's output_dir")
    run.add_argument("--force", action="store_true", help="recompute cells even when finished")
    run.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    run.add_argument("--json", action="store_true", help="with --dry-run: print the plan as JSON")
    run.set_defaults(func=cmd_run)

    merge = subparsers.add_parser("merge", help="collect the cells of several run/shard directories into one",
                                  description="Copy the cells of several run or shard directories into OUT "
                                              "(a cell present twice keeps its 'ok' copy) and write the report.")
    merge.add_argument("dirs", nargs="+", help="run or shard directories (each holding cells/)")
    merge.add_argument("--out", required=True, help="merged run directory")
    merge.add_argument("--no-report", action="store_true")
    merge.set_defaults(func=cmd_merge)

    demo = subparsers.add_parser("demo", help="the offline demo (configs/demo.yaml): tiny TOFU world + SmolLM2 RWKU")
    demo.add_argument("--config", default=str(DEMO_CONFIG), help="demo config (default: configs/demo.yaml)")
    demo.add_argument("--output-dir", help="override the demo's output_dir")
    demo.add_argument("--dry-run", action="store_true")
    demo.set_defaults(func=cmd_demo)


def _load(path: str, output_dir: str | None):
    from .config import load_config

    overrides = {"output_dir": output_dir} if output_dir else None
    return load_config(path, overrides)


def plan_summary(config, cells, selected_targets=None) -> dict:
    from .plan import describe_cell, pending_selections

    described = [describe_cell(cell) for cell in cells]
    downloads = sorted({d for item in described for d in item["downloads"]})
    data = {bench: (spec["data_dir"] or "Hub / CRU_HARNESS_* env (see data.sources)")
            for bench, spec in config.benchmarks.items()}
    return {"name": config.name, "output_dir": str(config.output_dir), "n_cells": len(cells),
            "n_trained": sum(1 for item in described if item["trains"] and not item["trains"].startswith("nothing")),
            "n_evaluated": sum(1 for item in described if item["evaluates"]), "downloads": downloads,
            "data": data, "cells": described, "target_selection": _selection_summary(config, selected_targets),
            "pending_selection": pending_selections(config, selected_targets)}


def _selection_summary(config, selected_targets) -> dict | None:
    rwku = config.benchmarks.get("rwku")
    if not rwku or not rwku.get("select_known"):
        return None
    select = rwku["select_known"]
    rule = (f"top {select['top']} of targets {rwku['targets']} by the original model's mean ROUGE-L recall on "
            f"{', '.join(select['probes'])} (first {select['rows'] or 'all'} rows)")
    return {"rule": rule, "chosen": dict(selected_targets or {})}


def print_plan(summary: dict, out=None) -> None:
    out = out or sys.stdout  # looked up per call, so redirected/captured stdout is honoured
    print(f"experiment {summary['name']}: {summary['n_cells']} cells -> {summary['output_dir']}", file=out)
    print(f"  trains {summary['n_trained']} cells, evaluates {summary['n_evaluated']}", file=out)
    for bench, where in summary["data"].items():
        print(f"  data {bench}: {where}", file=out)
    selection = summary.get("target_selection")
    if selection:
        print(f"  RWKU targets: {selection['rule']}", file=out)
        for model, chosen in selection["chosen"].items():
            print(f"    {model}: chosen earlier -> {chosen}", file=out)
        for model in summary.get("pending_selection", []):
            print(f"    {model}: chosen when the run starts (one lm-eval pass of the original model over the "
                  "candidates); its RWKU cells are planned then and not listed below", file=out)
    if summary["downloads"]:
        print("  downloads:", file=out)
        for item in summary["downloads"]:
            print(f"    - {item}", file=out)
    for item in summary["cells"]:
        print(f"  {item['hash']}  {item['cell']}", file=out)
        if item["trains"]:
            print(f"      trains: {item['trains']}", file=out)
        for download in item["downloads"]:
            print(f"      downloads: {download}", file=out)
        if item["evaluates"]:
            limit = f" (limit {item['limit']})" if item["limit"] else ""
            print(f"      evaluates: {', '.join(item['evaluates'])}{limit}", file=out)


def run_config(config, *, dry_run=False, shard=None, force=False, report=True, executor=None, as_json=False,
               log=print) -> int:
    """Plan (and unless dry_run, run) a validated config. `executor` defaults to the real one."""
    from .cache import CellStore, atomic_write_json
    from .plan import build_plan
    from .shard import parse_shard, select_shard
    from .targets import resolve_selected_targets

    # RWKU `select_known`: the targets are chosen (or a saved choice reused) before planning; a dry run only
    # reads saved choices. Every shard makes the same deterministic choice, or reuses the saved one.
    if not dry_run and executor is None:  # a cold cache builds the testbed models side by side, before anything
        from .models import prebuild_local_models

        prebuild_local_models(config, log=log)
    try:
        selected = resolve_selected_targets(config, run=not dry_run, log=log)
    except Exception as err:  # no RWKU cell can be planned without its targets: stop here, saying why
        raise ValueError(f"RWKU target selection (benchmarks.rwku.select_known) failed: "
                         f"{type(err).__name__}: {err}") from err
    cells = all_cells = build_plan(config, selected)
    if shard:
        index, count = parse_shard(shard)
        cells = select_shard(cells, index, count)
    summary = plan_summary(config, cells, selected)
    if dry_run:
        if as_json:
            print(json.dumps(summary, indent=1))
        else:
            print_plan(summary)
        return 0
    from .execute import PlanExecutor
    from .loop import run_cells

    store = CellStore(config.output_dir)
    if executor is None:  # the real one; it reads the retain cell (of the whole plan) for Forget Quality
        executor = PlanExecutor(store, all_cells)
    store.root.mkdir(parents=True, exist_ok=True)
    atomic_write_json(store.root / ("plan.json" if not shard else f"plan.shard{shard.replace('/', 'of')}.json"),
                      {"config": config.raw, "source": config.source, "shard": shard,
                       "cells": [{"hash": c.hash, "cell": c.describe()} for c in cells]})
    counts = run_cells(cells, store, executor, log=log, force=force)
    log(f"done: {counts}")
    if report:
        from ..reporting.cli import write_report

        write_report([store.root], store.root / "report", formats=config.report["formats"],
                     plots=config.report["plots"], stats=config.report["stats"], log=log)
    return 0 if counts["failed"] == 0 else 1


def cmd_run(args: argparse.Namespace) -> int:
    config = _load(args.config, args.output_dir)
    return run_config(config, dry_run=args.dry_run, shard=args.shard, force=args.force,
                      report=not args.no_report, as_json=args.json)


def merge_dirs(dirs, out) -> dict[str, int]:
    """Copy cells from several run directories into `out`; a duplicate keeps its 'ok' copy."""
    from .cache import CELLS_DIR, RESULT_FILE, CellStore, atomic_write_text
    from .targets import SELECTION_DIR

    out_store = CellStore(out)
    out_store.cells_dir.mkdir(parents=True, exist_ok=True)
    counts = {"copied": 0, "duplicates": 0}
    for directory in dirs:
        directory = Path(directory)
        store = CellStore(directory.parent if directory.name == CELLS_DIR else directory)
        if not store.cells_dir.is_dir():
            raise FileNotFoundError(f"{directory} holds no cells/ directory (not a cru-harness run)")
        selections = store.root / SELECTION_DIR
        if selections.is_dir():  # why the RWKU targets are these (runner.targets); identical across shards
            (out_store.root / SELECTION_DIR).mkdir(parents=True, exist_ok=True)
            for path in selections.glob("*.json"):
                destination = out_store.root / SELECTION_DIR / path.name
                if destination.resolve() != path.resolve():
                    atomic_write_text(destination, path.read_text())
        for cell_hash, result in store.iter_results():
            target = out_store.cell_dir(cell_hash)
            existing = out_store.load_result(cell_hash)
            if existing is not None:
                counts["duplicates"] += 1
                if existing.get("status") == "ok" or result.get("status") != "ok":
                    continue
            if target.resolve() == store.cell_dir(cell_hash).resolve():
                continue
            tmp = target.with_name(target.name + ".merging")
            if tmp.exists():
                shutil.rmtree(tmp)
            shutil.copytree(store.cell_dir(cell_hash), tmp, ignore=shutil.ignore_patterns("work"))
            if (tmp / RESULT_FILE).is_file():
                if target.exists():
                    shutil.rmtree(target)
                tmp.rename(target)
                counts["copied"] += 1
    return counts


def cmd_merge(args: argparse.Namespace) -> int:
    counts = merge_dirs(args.dirs, args.out)
    print(f"merged {len(args.dirs)} directories into {args.out}: {counts}")
    if not args.no_report:
        from ..reporting.cli import write_report

        write_report([Path(args.out)], Path(args.out) / "report")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    config = _load(args.config, args.output_dir)
    return run_config(config, dry_run=args.dry_run)
