"""The times README.md and docs/cli.md state, measured (the other measured figures: doc_measurements.py).

Parts (each optional; `--parts committed,quickstart,methods,first_use`):

- committed: the committed demo run (`results/demo/`), read from its run records, no computation: the cells' wall
  times (sum, and per cell kind), the torch thread count they ran at, and the RWKU target selection's own record.
- quickstart: the README's offline quickstart, step by step (`unlearn`, `inspect`, `lm_eval`, `score`), each as a
  subprocess timed from start to exit, in a temporary directory, at the thread count the commands choose (torch's
  default: one per core).
- methods: `cru-harness methods`, start to exit (import time dominates).
- first_use: the tiny model's first build (`zoo:llama:finetuned`), into an empty temporary cache.

Each measured line names the torch thread count and the machine's load average before and after (a shared machine
runs slower: say so beside the number).

    python benchmarks/stated_times.py --parts committed,quickstart,methods --out benchmarks/results/stated_times.md
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARTS = ("committed", "quickstart", "methods", "first_use")
QUICKSTART = [
    ("unlearn", "cru-harness unlearn --base zoo:llama:finetuned --data-dir testbed:world --forget forget10 "
                "--retain retain90 --out runs/quickstart --no-progress"),
    ("inspect", "cru-harness inspect runs/quickstart"),
    # `python -m lm_eval`: this interpreter's lm-eval, which the package's start-up hook extends
    ("lm_eval", f"{shlex.quote(sys.executable)} -m lm_eval --model cru --model_args base=zoo:llama:finetuned,routers=runs/quickstart --tasks "
                "tofu_forget10_suite --metadata '{\"data_dir\": \"testbed:world\"}' --batch_size 16 "
                "--output_path out/quickstart --log_samples"),
    ("score", "cru-harness score out/quickstart --data-dir testbed:world"),
]


def load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def threads() -> int:
    import torch

    return torch.get_num_threads()


def timed(command: str, cwd: Path, env: dict | None = None) -> dict:
    before = load()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(shlex.split(command), cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{command} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    # CPU seconds (user + system) move far less than wall time with the machine's load
    cpu = (after.ru_utime - used.ru_utime) + (after.ru_stime - used.ru_stime)
    return {"command": command, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1), "load_before": before,
            "load_after": load()}


def committed(run: Path = REPO / "results" / "demo") -> dict:
    total, kinds, counts = 0.0, defaultdict(float), set()
    for result_file in sorted((run / "cells").glob("*/result.json")):
        result = json.loads(result_file.read_text())
        record = json.loads((result_file.parent / "run_record.json").read_text())
        wall = result["resources"]["cell_wall_time_s"]
        total += wall
        kinds[f"{result['benchmark']} {result['kind']} {result['method']}"] += wall
        counts.add(record.get("torch_threads"))
    selection = [json.loads(p.read_text()) for p in sorted((run / "target_selection").glob("*.json"))]
    return {"run": str(run.relative_to(REPO)), "cells": len(list((run / "cells").iterdir())),
            "cells_minutes": round(total / 60, 1), "torch_threads": sorted(counts),
            "target_selection_seconds": [round(s["wall_time_s"]) for s in selection],
            "per_kind_minutes": {k: round(v / 60, 1) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}}


def quickstart() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="quickstart-") as tmp:
        return [{"step": step, **timed(command, Path(tmp))} for step, command in QUICKSTART]


def methods() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        return timed("cru-harness methods", Path(tmp))


def first_use() -> dict:
    with tempfile.TemporaryDirectory(prefix="cache-") as cache:
        code = "from cru_harness.testbed.names import resolve_model_path; resolve_model_path('zoo:llama:finetuned')"
        return timed(f"{sys.executable} -c {shlex.quote(code)}", REPO, env={"CRU_HARNESS_CACHE": cache})


def markdown(found: dict, parts: list[str]) -> str:
    lines = ["# Stated times, measured", "",
             f"`python benchmarks/stated_times.py --parts {','.join(parts)}` on {os.cpu_count()} cores; torch "
             f"threads {found.get('threads')}; load average (1 / 5 / 15 min) before and after each step: the "
             "machine was shared with other jobs when the load is above the core count.", ""]
    if "committed" in found:
        c = found["committed"]
        lines += [f"## Committed demo run ({c['run']}, from its run records)", "",
                  f"- {c['cells']} cells: {c['cells_minutes']} min of cells at torch threads {c['torch_threads']}",
                  f"- RWKU target selection: {', '.join(f'{s} s' for s in c['target_selection_seconds'])}", "",
                  "| cells | minutes |", "|---|---:|"]
        lines += [f"| {kind} | {minutes} |" for kind, minutes in c["per_kind_minutes"].items()] + [""]
    for part, title in (("quickstart", "Offline quickstart"), ("methods", "cru-harness methods"),
                        ("first_use", "First use: the tiny model's build")):
        if part not in found:
            continue
        rows = found[part] if isinstance(found[part], list) else [{"step": part, **found[part]}]
        lines += [f"## {title}", "", "| step | seconds | CPU seconds | load before | load after |",
                  "|---|---:|---:|---|---|"]
        lines += [f"| {r['step']} | {r['seconds']} | {r.get('cpu_seconds', '–')} | {r['load_before']} | "
                  f"{r['load_after']} |" for r in rows] + [""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="committed", help=f"comma-separated: {', '.join(PARTS)}")
    parser.add_argument("--out", default=None, help="write Markdown here (and JSON beside it)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the parts of --out's JSON that this call does not measure again")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    found: dict = {"threads": threads()}
    if args.merge and args.out and Path(args.out).with_suffix(".json").is_file():
        found = {**json.loads(Path(args.out).with_suffix(".json").read_text()), **found}
    for part in parts:
        found[part] = globals()[part]()
        print(json.dumps({part: found[part]}), flush=True)
    text = markdown(found, [p for p in PARTS if p in found])
    if args.out:
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(found, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
