"""Land a campaign's finished cells on this checkout (see README.md beside this file).

    python benchmarks/cpu_campaign/land.py CONFIG COMPUTE_DIR

Copies every planned cell that finished clean in COMPUTE_DIR (status ok, run record from a committed tree of the
pinned commit) and has not landed yet into the config's output_dir here: its result and run record only (no work/),
writes the whole plan as plan.json, and writes the report with this checkout's code. A config with `tuning:` lands
as `cru-harness run` writes it: its validation cells, the rule's record (`tuning/`, decided here from them; one the
worker saved must equal it) once they all have a result, and the reported cells at the chosen settings
(`worker.campaign_cells`). The worker's `recomputed.jsonl`
(landed cells made again for their models, their numbers compared) is added to the run's own. A cell that failed, or
was computed from an uncommitted tree or by other code than the cells already landed, stops the landing, naming it.
Run from the root of the checkout that commits the results (main), with this checkout's package installed.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import importlib.util

from cru_harness.reporting.tuning import TUNING_DIR
from cru_harness.runner.plan import write_plan
from cru_harness.runner.tuning import apply, load_with_tuning
from cru_harness.store import CellStore, atomic_write_json


def _worker():
    """worker.py beside this file (scripts, not a package): its plan of a campaign is the one landed."""
    spec = importlib.util.spec_from_file_location("campaign_worker", Path(__file__).with_name("worker.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def landable(cell_dir: Path) -> tuple[dict, dict] | None:
    """(result, record) of a cell that finished clean, else None; a failed or dirty one stops the landing."""
    result_path, record_path = cell_dir / "result.json", cell_dir / "run_record.json"
    if not (result_path.is_file() and record_path.is_file()):
        return None   # not finished (running, interrupted, or never started)
    result, record = json.loads(result_path.read_text()), json.loads(record_path.read_text())
    for name, doc in (("result", result), ("run record", record)):
        if doc.get("status") != "ok":
            sys.exit(f"{cell_dir}: {name} status {doc.get('status')}: {doc.get('reason')}; not landed")
    if record["git"]["dirty"]:
        sys.exit(f"{cell_dir}: computed from an uncommitted tree ({record['git']['dirty_files'][:3]}); not landed")
    return result, record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("compute_dir")
    args = parser.parse_args(argv)
    config = load_with_tuning(args.config)
    target, source = Path(config.output_dir), Path(args.compute_dir)
    computed = CellStore(source)
    worker = _worker()
    validation, planned, choice = worker.campaign_cells(config, lambda h: computed.load_result(h, quiet=True))
    cells = worker.campaign_plan(validation, planned)
    versions = {json.loads(p.read_text())["code_version"] for p in target.glob("cells/*/run_record.json")}
    landed = 0
    for cell in cells:
        found = landable(source / "cells" / cell.hash)
        if found is None:
            continue
        result, record = found
        versions.add(record["code_version"])
        if len(versions) > 1:
            sys.exit(f"{cell.hash}: code version {record['code_version']}, but the run holds {sorted(versions)}: "
                     "one campaign, one pinned commit")
        out = target / "cells" / cell.hash
        if (out / "result.json").is_file():
            continue   # landed before: its first computation stays (one made again is in recomputed.jsonl)
        out.mkdir(parents=True, exist_ok=True)
        for name in ("run_record.json", "result.json"):   # the result last: a cell without one is unfinished
            shutil.copyfile(source / "cells" / cell.hash / name, out / name)
        landed += 1
    if config.tuning is not None:   # as `cru-harness run` writes a tuned run: the validation cells, then the plan
        config = apply(config, choice)
        if choice is not None:   # the rule's record, as the worker saves it (it may not have yet: it re-plans later)
            name = f"{choice['model']}.json"
            saved, landed_record = source / TUNING_DIR / name, target / TUNING_DIR / name
            atomic_write_json(landed_record, choice)
            if saved.is_file() and json.loads(saved.read_text()) != json.loads(landed_record.read_text()):
                sys.exit(f"{saved}: the worker's saved choice differs from the rule's on the landed validation cells")
        write_plan(target, config, [*(c for c in validation if c.kind != "finetune"), *planned])
    else:
        write_plan(target, config, cells)
    # the cells made again for their models, compared with their landed numbers (worker.py): kept as evidence
    recomputed = source / "recomputed.jsonl"
    if recomputed.is_file():
        kept = target / "recomputed.jsonl"
        lines = kept.read_text().splitlines() if kept.is_file() else []
        lines += [line for line in recomputed.read_text().splitlines() if line not in lines]
        kept.write_text("".join(line + "\n" for line in lines))
    total = sum(1 for _ in target.glob("cells/*/result.json"))
    print(f"{target}: {landed} cells copied from {source}; {total} of {len(cells)} planned cells landed")
    from cru_harness.cli import main as cli

    return cli(["report", str(target)])


if __name__ == "__main__":
    sys.exit(main())
