"""`cru-harness study CONFIG`: run a study (configs/studies/) and write its table and plot."""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    study = subparsers.add_parser("study", help="run a study config (runner cells + the study's table and plot)",
                                  description="Run a study: the runner's cells (cached, resumable, with its "
                                              "report), then the study's table (markdown + csv) and plot under "
                                              "<output_dir>/study/. See configs/studies/.")
    study.add_argument("config", help="study YAML: a runner config plus a `study:` block")
    study.add_argument("--output-dir", help="override the config's output_dir")
    study.add_argument("--force", action="store_true", help="recompute finished cells")
    study.add_argument("--dry-run", action="store_true", help="validate and print the plan; touches no model")
    study.set_defaults(func=cmd_study)


def cmd_study(args: argparse.Namespace) -> int:
    from .config import load_study
    from .run import run_study

    overrides = {"output_dir": args.output_dir} if args.output_dir else None
    return run_study(load_study(args.config, overrides), force=args.force, dry_run=args.dry_run)
