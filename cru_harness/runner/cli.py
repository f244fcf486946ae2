"""`cru-harness run CONFIG`, `cru-harness merge DIR...`, `cru-harness demo`."""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from ..errors import InputError, MissingInputError, UserError, one_line

# configs/ ships inside the package as cru_harness.configs, so the demo also runs from a wheel install
# (`config.config_path` finds the shipped file where ./configs/demo.yaml is absent).
DEMO_CONFIG = "configs/demo.yaml"
# `cru-harness demo` computes here (never into the committed results/demo) and compares with results/demo.
DEMO_RUN_DIR = "results/demo-run"


def register(subparsers) -> None:
    run = subparsers.add_parser("run", help="run an experiment config (cells cached; resumes; --dry-run plans)",
                                description="Run every cell of an experiment config. Finished cells are skipped, "
                                            "an interrupted run resumes, and a report is written at the end.")
    run.add_argument("config", help="experiment YAML (see configs/ and docs/configs.md)")
    run.add_argument("--dry-run", action="store_true",
                     help="validate the config and print the cells (what is trained, downloaded, evaluated); "
                          "touches no model")
    run.add_argument("--shard", metavar="I/N", help="run only shard I of N (1-based; cells split by hash)")
    run.add_argument("--output-dir", help="override the config's output_dir")
    run.add_argument("--force", action="store_true", help="recompute cells even when finished")
    add_only_argument(run)
    run.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    run.add_argument("--json", action="store_true", help="with --dry-run: print the plan as JSON")
    add_reuse_argument(run)
    run.add_argument("--reproduce", metavar="DIR",
                     help="after the run, compare every cell and number with the run in DIR (e.g. committed "
                          "results) and write reproduction.md beside the run; exit status 1 when they differ")
    run.set_defaults(func=cmd_run)

    compare = subparsers.add_parser("compare", help="compare two run directories cell by cell (reproduction.md)",
                                    description="Compare every cell and number of RUN with REFERENCE (cells paired "
                                                "by config hash; exact on CPU), print a one-line verdict and write "
                                                "RUN/reproduction.md. Exit status 1 when they differ.")
    compare.add_argument("run", help="run directory (holding cells/)")
    compare.add_argument("reference", help="reference run directory, e.g. results/demo")
    compare.add_argument("--out", help="where reproduction.md and .json go (default: RUN itself; a read-only RUN "
                                       "still gets its verdict printed)")
    compare.set_defaults(func=cmd_compare)

    merge = subparsers.add_parser("merge", help="collect the cells of several run/shard directories into one",
                                  description="Copy the cells of several run or shard directories into OUT "
                                              "(a cell present twice keeps its 'ok' copy) and write the report.")
    merge.add_argument("dirs", nargs="+", help="run or shard directories (each holding cells/)")
    merge.add_argument("--out", required=True, help="merged run directory")
    merge.add_argument("--no-report", action="store_true")
    merge.set_defaults(func=cmd_merge)

    demo = subparsers.add_parser("demo", help="the offline demo (configs/demo.yaml): tiny TOFU world + SmolLM2 RWKU",
                                 description="Compute the demo into a fresh directory (default "
                                             f"{DEMO_RUN_DIR}; an interrupted demo resumes there) and compare it "
                                             "with the committed results/demo: reproduction.md, one-line verdict, "
                                             "exit status 1 when they differ.")
    demo.add_argument("--config", default=DEMO_CONFIG, help=f"demo config (default: {DEMO_CONFIG})")
    demo.add_argument("--output-dir", default=DEMO_RUN_DIR, help=f"where to compute (default: {DEMO_RUN_DIR})")
    demo.add_argument("--reproduce", metavar="DIR",
                      help="the results to compare with (default: the config's output_dir, results/demo, here or "
                           "in the checkout holding the package)")
    demo.add_argument("--dry-run", action="store_true")
    demo.set_defaults(func=cmd_demo)

    schema = subparsers.add_parser("config-schema", help="print the JSON schema of a runner config (for editors)",
                                   description="Print the JSON schema of an experiment config, with the registered "
                                               "benchmarks' blocks and evaluation keys: point an editor's YAML "
                                               "support at it. --markdown prints docs/configs.md's key table.")
    schema.add_argument("--markdown", action="store_true", help="the key table of docs/configs.md instead")
    schema.set_defaults(func=cmd_config_schema)


def cmd_config_schema(args) -> int:
    import json

    from .config import evaluation_keys
    from .schema import config_schema, key_table

    print(key_table() if args.markdown else json.dumps(config_schema(evaluation_keys()), indent=2),
          end="" if args.markdown else "\n")
    return 0


def add_reuse_argument(parser) -> None:
    parser.add_argument("--reuse", metavar="DIR",
                        help="before running, copy from run directory DIR the finished cells this plan holds (same "
                             "hash) and its saved RWKU target choice, e.g. a study starting from "
                             "results/gpu_smollm2's fine-tuned model, oracles and baselines; a copied cell is "
                             "reused as the output directory's own are (recomputed if other code made it); with "
                             "--only too, not only the named labels' (they start from the fine-tune and read the "
                             "oracle); a cell DIR holds under another label only (a study's paper-setting row) is "
                             "copied under this plan's label")


def add_only_argument(parser) -> None:
    parser.add_argument("--only", metavar="LABELS",
                        help="run only the cells of these method labels, comma-separated (e.g. IdkDPO,NPO after a "
                             "fix to them); the other cells are left as they are, and the report covers all")


def check_only(only: str, config) -> list[str]:
    """The labels `only` names (a comma-separated list); one that no cell of the config can have is an
    `InputError` naming the ones it has. Needs the config alone, so a run checks it before anything slow."""
    from .plan import build_plan

    wanted = [label.strip() for label in only.split(",") if label.strip()]
    # Planned as if every RWKU candidate were chosen: a config whose targets are chosen when the run starts
    # still has its RWKU cells' labels (Original, ...). Planning touches no model.
    selecting = [block for block in config.benchmarks.values() if block.get("select_known")]
    every = {m.name: selecting[0]["targets"] for m in config.models} if selecting else None
    known = list(dict.fromkeys([cell.label for cell in build_plan(config, every)]
                               + [method.label for method in config.methods]))
    unknown = [label for label in wanted if label not in known]
    if not wanted:
        raise InputError(f"--only {only!r} names no method label; {config.source}'s labels: {', '.join(known)}")
    if unknown:
        raise InputError(f"--only {only!r}: {', '.join(map(repr, unknown))} is not a method label of "
                         f"{config.source}; its labels: {', '.join(known)}")
    return wanted


def only_cells(cells, only: str | None, config) -> list:
    """The cells whose method label is one of `only` (`check_only`); every cell when None."""
    if only is None:
        return list(cells)
    wanted = check_only(only, config)
    return [cell for cell in cells if cell.label in wanted]


def machine_problems(config) -> list[UserError]:
    """What would fail the config's cells on this machine, found without loading a model: a local model path that
    is not a model directory (`locations.check_model_path`), a device this machine lacks (`devices.
    resolve_device`), an output_dir that cannot be written (`locations.check_output_dir`), each naming its key."""
    from ..devices import DeviceError, resolve_device
    from ..locations import ModelPathError, OutputLocationError, check_model_path, check_output_dir
    from .config import ConfigError

    problems: list[UserError] = []
    checked = set()
    for entry in security_summary(config):   # every model the run loads, with its key
        if entry["origin"] == "built-in testbed model" or entry["path"] in checked:
            continue
        checked.add(entry["path"])
        try:
            check_model_path(entry["path"], what="model")
        except ModelPathError as err:
            problems.append(ConfigError(entry["key"], str(err), config.source))
    try:
        resolve_device(config.device)
    except DeviceError as err:
        problems.append(ConfigError("device", str(err), config.source))
    try:
        check_output_dir(config.output_dir, what="output_dir", allow_existing=True)
    except OutputLocationError as err:
        problems.append(err)
    return problems


def check_local_models_exist(config) -> None:
    """A real run stops before any cell when a model given as a local path is not there: each cell would fail on
    its own, and transformers would read the path as a Hub repo id ("Repo id must be in the form ..."). (A dry
    run only warns: it may plan the run for another machine.)"""
    from .config import ConfigError

    for entry in security_summary(config):
        if entry["origin"] == "local path" and not Path(entry["path"]).expanduser().exists():
            raise ConfigError(entry["key"], f"model {entry['path']} does not exist (no such directory)",
                              config.source)
    check_method_inputs(config)


def check_method_inputs(config) -> None:
    """An input file a method reads (`*_path`, LUNAR's refusal prompts) must be there: a run and a dry run both
    stop on it (unlike a model, such a file is the user's own, not something another machine downloads)."""
    from ..fingerprints import setting_paths
    from .config import ConfigError

    for index, method in enumerate(getattr(config, "methods", ())):   # an input file a method reads (LUNAR's)
        for key, path in setting_paths(getattr(method, "hparams", {}) or {}).items():
            if not path.is_file():
                raise ConfigError(f"methods[{index}].{key}", f"{path} " + (
                    "is a directory, not a file" if path.is_dir() else "does not exist") + ": every cell of "
                    f"{getattr(method, 'label', 'this method')} would fail after the cells before it", config.source)


def _load(path: str, output_dir: str | None):
    from .tuning import load_with_tuning

    overrides = {"output_dir": output_dir} if output_dir else None
    return load_with_tuning(path, overrides)


def data_source(benchmark: str, data_dir: str | None) -> str:
    """Where a run will read a benchmark's data, in `data.sources.resolve_local_dir`'s order (the config's
    `data_dir`, the benchmark's variable, CRU_HARNESS_DATA_DIR, the Hub), without reading it (a dry run)."""
    import os

    from .. import plugins
    from ..data.sources import ENV_DATA_DIR

    source = getattr(plugins.benchmarks.get(benchmark), "data", None)   # the benchmark's `DataSource`
    if data_dir:
        return f"{data_dir} (the config's data_dir)"
    variables = tuple(v for v in (getattr(source, "env_var", None), ENV_DATA_DIR) if v)
    for variable in variables:
        if os.environ.get(variable):
            return f"{os.environ[variable]} (from {variable})"
    hub = f" ({source.hub_id})" if getattr(source, "hub_id", None) else ""
    unset = f"neither {variables[0]} nor {variables[1]} is" if len(variables) == 2 else f"{variables[0]} is not"
    return f"the Hugging Face Hub{hub}: the config names no data_dir and {unset} set"


def plan_summary(config, cells, selected_targets=None) -> dict:
    from .plan import describe_cell, pending_selections

    described = [describe_cell(cell) for cell in cells]
    downloads = sorted({d for item in described for d in item["downloads"]})
    data = {bench: data_source(bench, spec["data_dir"]) for bench, spec in config.benchmarks.items()}
    return {"name": config.name, "output_dir": str(config.output_dir), "n_cells": len(cells),
            "n_trained": sum(1 for item in described if item["kind"] != "attack" and item["trains"]
                             and not item["trains"].startswith("nothing")),
            "n_attacked": sum(1 for item in described if item["kind"] == "attack"),
            "n_evaluated": sum(1 for item in described if item["evaluates"]), "downloads": downloads,
            "data": data, "cells": described, "target_selection": _selection_summary(config, selected_targets),
            "pending_selection": pending_selections(config, selected_targets),
            "security": security_summary(config), **_training_summary(config)}


def _training_summary(config) -> dict:
    """How weight-training cells run, when the config's `training:` names an engine: the launch command."""
    from ..training.launch import LaunchSettings

    settings = LaunchSettings.from_dict(config.training)
    if not settings.launches:
        return {}
    return {"training": {**config.training, "command": " ".join(settings.command())}}


def _origin(path: str) -> str:
    from ..testbed.names import is_builtin_model
    from .plan import is_hub_id

    if is_builtin_model(path):
        return "built-in testbed model"
    return "Hugging Face Hub" if is_hub_id(path) else "local path"


def security_summary(config) -> list[dict]:
    """Every model the run loads (weights, tokenizer, and with trust_remote_code Python code) and from where."""
    entries = []
    for i, model in enumerate(config.models):
        entries.append({"key": f"models[{i}]", "name": model.name, "path": model.path,
                        "origin": _origin(model.path), "trust_remote_code": model.trust_remote_code})
        for split, spec in sorted(model.retain.items()):
            if spec.kind == "checkpoint":
                entries.append({"key": f"models[{i}].retain.{split}", "name": f"{model.name} retain {split}",
                                "path": spec.value, "origin": _origin(spec.value),
                                "trust_remote_code": model.trust_remote_code})
    # A local checkpoint a method's entry names (PURGE's) is evaluated under the spec of the models it runs on,
    # hence with their trust_remote_code.
    from .. import plugins

    for spec in config.methods:
        trusted = any(m.trust_remote_code for m in config.models if set(spec.benchmarks) & set(m.benchmarks))
        for key, what, path in plugins.methods.get(spec.method).entry_paths(spec.settings):
            entries.append({"key": f"methods[{spec.index}].{key}", "name": what, "path": path,
                            "origin": _origin(path), "trust_remote_code": trusted})
    return entries


def _selection_summary(config, selected_targets) -> dict | None:
    rwku = next((block for block in config.benchmarks.values() if block.get("select_known")), None)
    if rwku is None:
        return None
    select = rwku["select_known"]
    rule = (f"top {select['top']} of targets {rwku['targets']} by the original model's mean ROUGE-L recall on "
            f"{', '.join(select['probes'])} ({'first ' + str(select['rows']) if select['rows'] else 'all'} rows)")
    return {"rule": rule, "chosen": dict(selected_targets or {})}


def print_plan(summary: dict, out=None) -> None:
    out = out or sys.stdout  # looked up per call, so redirected/captured stdout is honoured
    count = f"{summary['n_cells']} cells"
    if summary.get("only") is not None:
        count = f"{summary['n_cells']} of {summary['n_planned']} cells (--only {summary['only']})"
    print(f"experiment {summary['name']}: {count} -> {summary['output_dir']}", file=out)
    attacks = f", attacks {summary['n_attacked']}" if summary["n_attacked"] else ""
    print(f"  trains {summary['n_trained']} cells{attacks}, evaluates {summary['n_evaluated']}", file=out)
    for bench, where in summary["data"].items():
        print(f"  data {bench}: {where}", file=out)
    if "training" in summary:
        training = summary["training"]
        print(f"  training: {training['engine']} on {training['num_processes']} process(es), each weight-training "
              f"cell as: {training['command']}", file=out)
    print("  models loaded (weights; code too where trust_remote_code is true):", file=out)
    for entry in summary["security"]:
        print(f"    {entry['key']} {entry['name']}: {entry['path']} ({entry['origin']}), "
              f"trust_remote_code: {str(entry['trust_remote_code']).lower()}", file=out)
    if (tuning := summary.get("tuning")):
        print(f"  tuning: {tuning['rule']}, {tuning['validation_cells']} validation cells first", file=out)
        for label, chosen in tuning["chosen"].items():
            print(f"    {label}: {chosen}", file=out)
        if tuning["pending"]:
            print(f"    planned once the rule has chosen: {', '.join(tuning['pending'])}", file=out)
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
               log=print, reproduce=None, inputs=None, only=None, reuse=None, reuse_bundles=False) -> int:
    """Plan (and unless dry_run, run) a validated config. `executor` defaults to the real one, `inputs` (what a
    finished cell's record must match to be reused) to `provenance.cell_inputs` with it (else the code version).
    `reproduce`: a run directory to compare with at the end (`reproduce.write_reproduction`); exit status 1 when
    the run does not reproduce it. `only`: method labels (`only_cells`) whose cells alone run. `reuse`: a run
    directory whose finished cells of this plan are copied in first (`reuse_cells`; `reuse_bundles`: the run
    reads its CRU cells' router bundles, as a gate_gap study does).

    Every run, a dry run too, first refuses an output directory that is the root or home directory, or that
    exists and holds neither nothing nor a run of this experiment (`store.check_run_directory`): a run writes
    plan.json, cells/ and report/ there. A real run then checks that it can be written and takes the directory's lock
    (`cache.RunLock`): a second run on the same directory stops there, naming the process that holds it."""
    if reproduce is not None:
        reproduce = Path(reproduce)
        if reproduce.resolve() == Path(config.output_dir).resolve():
            raise InputError(f"--reproduce {reproduce} is the run's own output directory; compute into another "
                             "one (--output-dir) so the results to compare with are not overwritten")
    if only is not None:  # before the testbed models are built and RWKU targets chosen (minutes)
        check_only(only, config)
    if reuse is not None:
        reuse = run_stores([reuse])[0].root   # a mistyped directory stops here, before anything runs
        if reuse.resolve() == Path(config.output_dir).resolve():
            raise InputError(f"--reuse {reuse} is the run's own output directory")
    from ..locations import check_not_shared_directory
    from ..store import check_run_directory

    # before anything is planned or written, a dry run too: a run writes plan.json, cells/, report/ there
    check_not_shared_directory(config.output_dir, "output_dir")
    check_run_directory(config.output_dir, config.name)
    options = dict(shard=shard, force=force, report=report, executor=executor, as_json=as_json, log=log,
                   reproduce=reproduce, inputs=inputs, only=only, reuse=reuse, reuse_bundles=reuse_bundles)
    check_method_inputs(config)   # the user's own files: refused by a dry run too
    if dry_run:
        return _run_config(config, dry_run=True, **options)
    from ..locations import check_output_dir
    from ..store import RunLock
    from .shard import parse_shard

    if shard:
        parse_shard(shard)  # a bad --shard is reported before anything is locked or written
    check_local_models_exist(config)
    check_output_dir(config.output_dir, what="output_dir", allow_existing=True)
    with RunLock(config.output_dir, shard=shard, log=log):
        return _run_config(config, dry_run=False, **options)


def _run_config(config, *, dry_run, shard, force, report, executor, as_json, log, reproduce, inputs, only,
                reuse, reuse_bundles) -> int:
    from ..errors import TargetSelectionError
    from ..store import CellStore
    from .plan import build_plan, write_plan
    from .shard import parse_shard, select_shard
    from .targets import resolve_selected_targets

    # RWKU `select_known`: the targets are chosen (or a saved choice reused) before planning; a dry run only
    # reads saved choices. Every shard makes the same deterministic choice, or reuses the saved one.
    if not dry_run and executor is None:  # a cold cache builds the testbed models side by side, before anything
        from .models import prebuild_local_models

        prebuild_local_models(config, log=log)
    if reuse is not None and not dry_run:   # its saved target choice first: the choice is the same, and costly
        copy_target_choices(CellStore(reuse), CellStore(config.output_dir), overwrite=False)
    try:
        selected = resolve_selected_targets(config, run=not dry_run, log=log)
    except UserError as err:  # no RWKU cell can be planned without its targets: stop here, saying why (a bug
        # in the selection keeps its traceback)
        from .targets import selecting_benchmark

        raise TargetSelectionError(f"target selection (benchmarks.{selecting_benchmark(config)}.select_known) "
                                   f"failed: {type(err).__name__}: {err}") from err
    validation, tuning = [], None
    if config.tuning is not None:   # its validation cells run first; the tuned entries are planned at the choice
        from .tuning import check_resolved, run_tuning

        check_resolved(config)
        if shard:
            raise InputError("a config with `tuning:` runs its validation cells before planning the rest: run it "
                             "without --shard")
        new_executor = None
        if not dry_run and executor is None:
            from .execute import PlanExecutor as new_executor
        config, validation, tuning = run_tuning(config, dry_run=dry_run, executor=executor, new_executor=new_executor,
                                                inputs=inputs, force=force, log=log)
    cells = all_cells = build_plan(config, selected)
    from .inputs import check_attack_inputs

    for note in check_attack_inputs(config, all_cells):   # before any training, a dry run too
        log(note)
    if shard:
        index, count = parse_shard(shard)
        cells = select_shard(cells, index, count)
    to_run = only_cells(cells, only, config)  # the plan (and plan.json) stays whole
    summary = plan_summary(config, [*validation, *to_run], selected)   # a dry run shows what would run
    if only is not None:
        summary.update(only=only, n_planned=len(cells))   # as given: only_cells checked it
    if config.tuning is not None:
        summary["tuning"] = {"rule": config.tuning.rule, "validation_cells": len(validation),
                             "chosen": {label: m["chosen"] for label, m in (tuning or {}).get("methods", {}).items()},
                             "pending": [] if tuning else list(config.tuning.settings)}
    if dry_run:
        # A warning, not a refusal: a dry run may plan the run for another machine (a GPU config on a laptop).
        problems = machine_problems(config)
        summary["problems"] = [one_line(err) for err in problems]
        if as_json:
            print(json.dumps(summary, indent=1))
        else:
            print_plan(summary)
        for problem in summary["problems"]:
            print(f"warning: a run on this machine would fail: {problem}", file=sys.stderr)
        return 0
    from .execute import PlanExecutor
    from .loop import run_cells

    from .provenance import git_state

    git = git_state()
    if git["dirty"]:  # visible before anything runs: such cells cannot be re-run from any commit
        log(f"warning: the package has uncommitted changes ({', '.join(git['dirty_files'][:5])}): this run's cells "
            "are recorded as computed from a dirty tree; do not commit them")
    store = CellStore(config.output_dir, log=log)
    if executor is None:  # the real one; it reads the retain cell (of the whole plan) for Forget Quality
        from .provenance import cell_inputs

        executor = PlanExecutor(store, [*validation, *all_cells], log=log)
        inputs = inputs or cell_inputs
    store.root.mkdir(parents=True, exist_ok=True)
    write_plan(store.root, config, [*validation, *cells], shard)
    if reuse is not None:   # the plan's, not only --only's: those cells start from the shared fine-tune
        reuse_cells(reuse, store, cells, log, bundles=reuse_bundles)
    from .loop import recorded_walls

    # with a reference run (the demo's committed one), the time left is each cell's own time there, at this pace
    walls = recorded_walls(reproduce) if reproduce is not None else None
    counts = run_cells(to_run, store, executor, log=log, force=force, reference_walls=walls,
                       **({"inputs": inputs} if inputs else {}))
    log(f"done: {counts}")
    if report:
        from ..errors import WRITE_ERRNOS, OutputWriteError
        from ..reporting.cli import write_report

        try:
            write_report([store.root], store.root / "report", formats=config.report["formats"],
                         plots=config.report["plots"], stats=config.report["stats"], log=log)
        except OSError as err:   # a full disk while the report is written: the cells are whole, say so
            if err.errno not in WRITE_ERRNOS:
                raise
            raise OutputWriteError(f"cannot write the report into {store.root / 'report'}: {err.strerror}; the "
                                   f"cells are kept whole: `cru-harness report {store.root}` "
                                   "writes the report once that is fixed") from err
    status = 0 if counts["failed"] == 0 else 1
    if any((store.load_result(cell.hash, quiet=True) or {}).get("status") == "failed" for cell in validation):
        status = 1   # a failed validation cell: its setting could not be chosen
    if reproduce is not None:
        from .reproduce import write_reproduction

        if not write_reproduction(store.root, reproduce, log=log).reproduced:
            status = 1
    return status


def cmd_run(args: argparse.Namespace) -> int:
    config = _load(args.config, args.output_dir)
    if args.reproduce and not Path(args.reproduce).is_dir():
        raise MissingInputError(f"--reproduce {args.reproduce}: no such run directory")
    return run_config(config, dry_run=args.dry_run, shard=args.shard, force=args.force,
                      report=not args.no_report, as_json=args.json, reproduce=args.reproduce, only=args.only,
                      reuse=args.reuse)


def cmd_compare(args: argparse.Namespace) -> int:
    from .reproduce import write_reproduction

    from ..locations import check_files_dir
    from ..store import CELLS_DIR

    for directory in (args.run, args.reference):
        if not Path(directory).is_dir():
            raise MissingInputError(f"no such run directory: {directory}")
        if not (Path(directory) / CELLS_DIR).is_dir():
            raise MissingInputError(f"{directory} holds no {CELLS_DIR}/ directory (not a cru-harness run)")
    if args.out is not None:
        check_files_dir(args.out, what="--out")
    return 0 if write_reproduction(args.run, args.reference, out_dir=args.out).reproduced else 1


def run_stores(dirs) -> list:
    """The cell stores of run directories (each a run's root or its cells/), or a `MissingInputError` naming the
    first one that is not a cru-harness run."""
    from ..store import CELLS_DIR, CellStore

    stores = []
    for directory in map(Path, dirs):
        store = CellStore(directory.parent if directory.name == CELLS_DIR else directory)
        if not store.cells_dir.is_dir():
            raise MissingInputError(f"{directory} holds no cells/ directory (not a cru-harness run)")
        stores.append(store)
    return stores


def merge_dirs(dirs, out) -> dict[str, int]:
    """Copy cells from several run directories into `out`; a duplicate keeps its 'ok' copy."""
    from ..store import CellStore, atomic_write_text

    stores = run_stores(dirs)   # every input checked before `out` is created
    out_store = CellStore(out)
    out_store.cells_dir.mkdir(parents=True, exist_ok=True)
    counts = {"copied": 0, "duplicates": 0}
    for position, store in enumerate(stores):
        for plan in sorted(store.root.glob("plan*.json")):   # so that the report names planned cells left undone
            destination = out_store.root / plan.name
            if destination.resolve() == plan.resolve():
                continue
            text = plan.read_text()
            if destination.is_file() and destination.read_text() != text:   # another run's plan of that name
                destination = out_store.root / f"{plan.stem}.input{position}.json"
            atomic_write_text(destination, text)
        copy_target_choices(store, out_store)   # identical across shards
        for cell_hash, result in store.iter_results():
            if out_store.load_result(cell_hash) is not None:
                counts["duplicates"] += 1
            counts["copied"] += copy_cell(store, out_store, cell_hash, keep_ok=False)
    return counts


def _is_adapter(cell) -> bool:
    """Whether a cell's method leaves router bundles beside its result (`Method.adapter`: CRU)."""
    from .. import plugins

    return cell.kind == "method" and plugins.methods.get(cell.method).adapter


def reuse_cells(source, store, cells, log=print, *, bundles: bool = False) -> int:
    """`--reuse`: copy the finished ('ok') cells of run directory `source` that `cells` plan into `store`; returns
    how many it copied. A planned cell `source` does not hold by hash is copied from a finished one that differs
    from it only in its label (`plan.computation_key`: a study's `CRU-lambda1` row is the run's `CRU` cell),
    under the planned cell's hash and label; its record names the cell it came from (`reused_from`). With
    `bundles` (the caller reads CRU cells' router bundles), such a cell is copied only with its bundle, which a
    run's tarball leaves out (benchmarks/gpu_session/run.sh): without one on disk it is computed again."""
    from ..store import CellStore
    from .plan import computation_key

    source = CellStore(source)
    copied = sum(copy_cell(source, store, cell.hash, keep_ok=True) for cell in cells)
    wanted = [cell for cell in cells if (store.load_result(cell.hash) or {}).get("status") != "ok"]
    relabelled = []
    if wanted:
        by_computation: dict[str, tuple[str, str]] = {}   # key -> (hash, label); sorted by hash: one choice
        for cell_hash, result in source.iter_results():
            resolved = (source.load_record(cell_hash) or {}).get("resolved_config")
            if result.get("status") == "ok" and isinstance(resolved, dict):
                by_computation.setdefault(computation_key(resolved), (cell_hash, result["label"]))
        for cell in wanted:
            origin, label = by_computation.get(cell.computation, (None, None))
            if origin is not None and copy_cell(source, store, origin, keep_ok=True, as_cell=cell,
                                                bundle=bundles and _is_adapter(cell)):
                relabelled.append(f"{cell.label} <- {label}")
    log(f"--reuse {source.root}: copied {copied} finished cell(s) of this plan"
        + (f", and {len(relabelled)} that differ only in label ({'; '.join(sorted(set(relabelled)))})"
           if relabelled else ""))
    return copied + len(relabelled)


def copy_target_choices(store, out_store, *, overwrite: bool = True) -> None:
    """The saved RWKU target choices (`runner.targets`) of one run directory into another; without `overwrite`,
    a choice the other directory has already made is kept (its cells were planned from it)."""
    from ..store import atomic_write_text
    from .targets import SELECTION_DIR

    selections = store.root / SELECTION_DIR
    if selections.is_dir():
        (out_store.root / SELECTION_DIR).mkdir(parents=True, exist_ok=True)
        for path in selections.glob("*.json"):
            destination = out_store.root / SELECTION_DIR / path.name
            if destination.resolve() != path.resolve() and (overwrite or not destination.exists()):
                atomic_write_text(destination, path.read_text())


def copy_cell(store, out_store, cell_hash: str, *, keep_ok: bool, as_cell=None, bundle: bool = False) -> bool:
    """Copy one cell (its result and record, not its work/ files) from `store` into `out_store`, whole or not
    at all. Nothing is copied when `store` has no result for it, or when `out_store`'s is 'ok' or the copy's is
    not; with `keep_ok`, only an 'ok' result is copied at all. `as_cell`: a planned cell that differs from it only
    in label (`reuse_cells`), whose hash and label the copy takes. `bundle`: copy the cell's router bundle too
    (work/routers), and nothing if it has none. Returns whether it copied."""
    from ..store import RECORD_FILE, RESULT_FILE, WORK_DIR, atomic_write_json, read_json, with_digest
    from .training import ROUTERS_DIR

    result = store.load_result(cell_hash)
    if result is None or (keep_ok and result.get("status") != "ok"):
        return False
    new_hash = cell_hash if as_cell is None else as_cell.hash
    existing = out_store.load_result(new_hash)
    if existing is not None and (existing.get("status") == "ok" or result.get("status") != "ok"):
        return False
    target = out_store.cell_dir(new_hash)
    if target.resolve() == store.cell_dir(cell_hash).resolve():
        return False
    out_store.check_writable(new_hash)   # never over a newer cru-harness's cell, nor through a link
    routers = Path(WORK_DIR) / ROUTERS_DIR
    if bundle and not (store.cell_dir(cell_hash) / routers).is_dir():
        return False
    tmp = target.with_name(target.name + ".merging")
    if tmp.exists():
        shutil.rmtree(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(store.cell_dir(cell_hash), tmp, ignore=shutil.ignore_patterns(WORK_DIR, ".*.tmp", "previous.*"))
    if bundle:
        shutil.copytree(store.cell_dir(cell_hash) / routers, tmp / routers)
    if not (tmp / RESULT_FILE).is_file():
        shutil.rmtree(tmp)
        return False
    if as_cell is not None:   # record first, as CellStore.write does
        from .plan import computation_key

        record = read_json(tmp / RECORD_FILE)
        if computation_key(record.get("resolved_config") or {}) != as_cell.computation:
            shutil.rmtree(tmp)
            raise ValueError(f"cell {cell_hash} is not {as_cell.describe()} under another label")
        atomic_write_json(tmp / RECORD_FILE, dict(
            record, hash=new_hash, resolved_config=as_cell.resolved(),
            reused_from={"hash": cell_hash, "label": result["label"], "run": str(store.root)}))
        atomic_write_json(tmp / RESULT_FILE, with_digest(dict(result, hash=new_hash, label=as_cell.label)))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return True


def cmd_merge(args: argparse.Namespace) -> int:
    from ..locations import check_output_dir
    from ..store import RunLock, check_run_directory

    check_output_dir(args.out, what="--out", allow_existing=True)
    check_run_directory(args.out, None, what="--out")   # merges into a run directory, never among other files
    run_stores(args.dirs)   # a mistyped input creates no --out (the lock below would)
    with RunLock(args.out):  # no run may write into the merged directory meanwhile
        counts = merge_dirs(args.dirs, args.out)
    print(f"merged {len(args.dirs)} directories into {args.out}: {counts}")
    if not args.no_report:
        from ..reporting.cli import recorded_report_settings, write_report

        settings, _ = recorded_report_settings([Path(args.out)])   # the config's `report:`, from the shards' plans
        write_report([Path(args.out)], Path(args.out) / "report", formats=settings["formats"],
                     plots=settings["plots"], stats=settings["stats"])
    return 0


def committed_results(config_output_dir: str | Path) -> Path | None:
    """The committed results of a config: its `output_dir` as given (relative to the working directory), else
    under the checkout that holds the package (an editable install run from elsewhere); None from a wheel."""
    given = Path(config_output_dir)
    candidates = [given]
    if not given.is_absolute():
        candidates.append(Path(__file__).resolve().parents[2] / given)
    return next((c for c in candidates if (c / "cells").is_dir()), None)


def cmd_demo(args: argparse.Namespace) -> int:
    committed = _load(args.config, None).output_dir
    config = _load(args.config, args.output_dir)
    reference = Path(args.reproduce) if args.reproduce else committed_results(committed)
    if reference is not None and reference.resolve() == Path(config.output_dir).resolve():
        raise InputError(f"--output-dir {args.output_dir} holds the results to compare with; choose a fresh one")
    if reference is not None and not reference.is_dir():   # a dry run too: it is what the real run would meet
        raise MissingInputError(f"--reproduce {reference}: no such run directory")
    if reference is None:   # a dry run says it too: it is what the real run would do
        print(f"no committed results at {committed} (a wheel install has none): the demo runs without comparison")
    if args.dry_run:
        return run_config(config, dry_run=True)
    if reference is not None:
        print(f"computing into {config.output_dir}; at the end every cell is compared with {reference}")
    return run_config(config, reproduce=reference)
