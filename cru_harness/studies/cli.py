"""`cru-harness study CONFIG`: run a study (configs/studies/) and write its table and plot."""
from __future__ import annotations

import argparse

from ..errors import InputError
from ..runner.cli import add_only_argument, add_reuse_argument


def register(subparsers) -> None:
    study = subparsers.add_parser("study", help="run a study config (runner cells + the study's table and plot)",
                                  description="Run a study: the runner's cells (cached, resumable, with its "
                                              "report), then the study's table (markdown + csv) and plot under "
                                              "<output_dir>/study/. See configs/studies/.")
    study.add_argument("config", help="study YAML: a runner config plus a `study:` block")
    study.add_argument("--output-dir", help="override the config's output_dir")
    study.add_argument("--scale", metavar="CONFIG",
                       help="run the study at another scale: the models, benchmarks (those the study uses) and "
                            "evaluation of this runner config, e.g. configs/cpu_smollm2.yaml; output goes to "
                            "<output_dir>-<its name>")
    study.add_argument("--seeds", help="override the seeds, e.g. 0 or 0,1,2")
    study.add_argument("--force", action="store_true", help="recompute finished cells and analyses")
    add_only_argument(study)
    add_reuse_argument(study)
    study.add_argument("--shard", metavar="I/N",
                       help="run only shard I of N of the study's cells (1-based, as `run --shard`), in parallel or "
                            "on several machines; no table is written: run the study once more without --shard "
                            "(after merging the shards' cells) to write it from the finished cells")
    study.add_argument("--table-only", action="store_true",
                       help="write the table and plots from the cells already finished (an overlap / gate_gap "
                            "study: from its saved analyses), running and loading none (cells and analyses "
                            "computed by other code are read as they are, and the table says so), e.g. to "
                            "regenerate a committed study's table")
    study.add_argument("--dry-run", action="store_true", help="validate and print the plan; touches no model")
    study.set_defaults(func=cmd_study)


def cmd_study(args: argparse.Namespace) -> int:
    from .config import load_study
    from .run import run_study

    overrides = {}
    if args.output_dir:
        overrides["output_dir"] = args.output_dir
    if args.seeds:
        try:
            overrides["seeds"] = [int(seed) for seed in args.seeds.split(",")]
        except ValueError:
            raise InputError(f"--seeds {args.seeds!r}: expected integers separated by commas, e.g. 0,1,2") from None
    study = load_study(args.config, overrides or None, scale=args.scale)
    return run_study(study, force=args.force, dry_run=args.dry_run, shard=args.shard, table_only=args.table_only,
                     only=args.only, reuse=args.reuse)
