"""Hold chosen coordinates' gates open in trained CRU bundles and evaluate again: does the collapse come from them?

benchmarks/outlier_gates.py found that at lambda >= 10 on forget01 the later-token gate of one top-magnitude
coordinate (17) separates the seed that keeps the model (1.00) from the seeds that destroy it (0.73-0.76): a
correlation. This is the intervention. A cell's bundle with the named coordinates taken out of every block's
selection (their router outputs dropped: their gate is 1, and every other gate is unchanged to float32 rounding,
since a router's outputs are independent sigmoids of one hidden layer) is evaluated on the cell's own tasks, limit
and prompts by the runner's evaluation and scoring (`evaluate_cell`, `score_cell`; Forget Quality against the
cell's retain oracle). Beside each held set, as a control, as many other selected coordinates per block drawn at
random (seeded), and the unchanged bundle evaluated again: it must give the cell's recorded numbers, else the rows
compare code versions. `--hold top` holds per block the top 1 % magnitude coordinates a reference bundle excluded
(as benchmarks/outlier_gates.py reads them). It needs the cells' work/ folders (bundles, fine-tuned checkpoint):
run it where the study ran.

    python benchmarks/hold_gates_open.py --config STUDY.yaml [--scale RUN.yaml] --labels L1,L2 [--seeds 1,2] \
        --hold 17 [--hold 14,17,31 ...] [--hold top --reference CELL_DIR] [--no-recheck] \
        STUDY_DIR [MORE_DIRS ...] --out FILE.md

A CRU cell's bundle is taken from the first directory holding it; the fine-tuned checkpoint from the first one.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import tempfile
from pathlib import Path

import torch

from cru_harness.cru import Router, RouterBundle
from cru_harness.cru.bundle import MANIFEST_NAME, read_manifest
from cru_harness.store import WORK_DIR, CellStore
from cru_harness.runner.evaluation import evaluate_cell, score_cell
from cru_harness.runner.prompting import use_chat_template
from cru_harness.runner.models import resolve_data_dir
from cru_harness.runner.plan import build_plan, retain_cell_for
from cru_harness.runner.training import ROUTERS_DIR
from cru_harness.studies.config import load_study
from cru_harness.studies.run import base_path_for

ROUTERS = Path(WORK_DIR) / ROUTERS_DIR   # where the runner keeps a CRU cell's bundle
CONTROL_SEED = 0
COLUMNS = [("forget 1-ROUGE-L", "forget_rouge_l", True), ("forget prob", "forget_prob", False),
           ("retain ROUGE-L", "retain_rouge_l", False), ("real authors ROUGE-L", "ra_rouge_l", False),
           ("world facts ROUGE-L", "wf_rouge_l", False), ("MU", "model_utility", False),
           ("FQ", "forget_quality", False)]


def without_coordinates(bundle: RouterBundle, held: dict[int, set[int]]) -> RouterBundle:
    """`bundle` with the coordinates `held[block]` out of its selection: their gates are 1 (not gated), every
    other gate as before. A block left with no coordinate is no longer gated."""
    neurons, routers = {}, {}
    for block in bundle.block_indices:
        selected = bundle.neuron_indices(block).tolist()
        keep = [i for i, c in enumerate(selected) if c not in held.get(block, set())]
        if not keep:
            continue
        old = bundle.router(block)
        new = Router(old.hidden_size, len(keep), old.d_r, input_norm=old.input_norm)
        state = old.state_dict()
        rows = torch.tensor(keep)
        state["w2.weight"], state["w2.bias"] = state["w2.weight"][rows], state["w2.bias"][rows]
        new.load_state_dict(state)
        neurons[block], routers[block] = [selected[i] for i in keep], new
    if not neurons:
        raise ValueError("holding these coordinates open leaves no gated coordinate in any block")
    config = dataclasses.replace(bundle.config, block_indices=sorted(neurons), neurons=neurons,
                                 excluded={b: c for b, c in bundle.config.excluded.items() if b in neurons})
    return RouterBundle(config, routers).eval()


def held_sets(bundle: RouterBundle, coordinates: set[int] | dict[int, set[int]], seed: int) -> tuple[dict, dict]:
    """Per block: the given coordinates (the same in every block, or per block) the block selected, and as many
    of its other selected ones at random."""
    rng = random.Random(seed)
    held, control = {}, {}
    for block in bundle.block_indices:
        wanted = coordinates.get(block, set()) if isinstance(coordinates, dict) else coordinates
        selected = bundle.neuron_indices(block).tolist()
        held[block] = {c for c in selected if c in wanted}
        others = sorted(set(selected) - wanted)
        control[block] = set(rng.sample(others, min(len(held[block]), len(others))))
    return held, control


def evaluate(cell, bundle: RouterBundle, base_path: str, retain_result: dict | None, work: Path) -> dict:
    """The cell's evaluation and scores with `bundle` as its routers (the runner's functions, as its cell ran)."""
    bundle.save_pretrained(work / "routers")
    data_dir = resolve_data_dir(cell.data_dir)
    evaluation = evaluate_cell(cell, base_path, str(work / "routers"), work, data_dir,
                               use_chat_template(cell, base_path))
    scored = score_cell(cell, evaluation["output_dir"], data_dir=data_dir, original_model=base_path,
                        retain_result=retain_result)
    return {"metrics": scored["metrics"], "failure_classes": scored.get("failure_classes", {})}


def row(cell, variant: str, n_held: str, result: dict) -> str:
    metrics = result["metrics"]
    values = []
    for _, key, flip in COLUMNS:
        value = metrics.get(key)
        if value is None:
            values.append("–")
        else:   # Forget Quality is a p-value: small ones matter, so significant digits
            values.append(f"{value:.2g}" if key == "forget_quality" else f"{1 - value if flip else value:.3f}")
    degenerate = (result.get("failure_classes") or {}).get("forget", {}).get("degenerate")
    return (f"| {cell.label} | {cell.seed} | {variant} | {n_held} | " + " | ".join(values)
            + f" | {'–' if degenerate is None else f'{degenerate:.2f}'} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="the study config the cells were planned by")
    parser.add_argument("--scale", type=Path, help="the --scale config the study ran with")
    parser.add_argument("--labels", required=True, help="CRU method labels to intervene on, comma-separated")
    parser.add_argument("--seeds", help="only these seeds, comma-separated (default: all the plan has)")
    parser.add_argument("--hold", action="append", required=True,
                        help="coordinates to hold open together, comma-separated, or `top`: per block the top 1 %% "
                             "magnitude coordinates the --reference bundle excluded; repeat for another set")
    parser.add_argument("--reference", type=Path,
                        help="for --hold top: a cell whose bundle was trained with exclude_top_magnitude")
    parser.add_argument("--no-recheck", action="store_true",
                        help="do not evaluate the unchanged bundles again (another run of this script with this code "
                             "has checked that they give the recorded numbers)")
    parser.add_argument("dirs", type=Path, nargs="+", help="study output directories (with cells/)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        holds = [spec if spec == "top" else sorted({int(c) for c in spec.split(",")}) for spec in args.hold]
        seeds = None if args.seeds is None else {int(s) for s in args.seeds.split(",")}
    except ValueError as exc:
        sys.exit(f"--hold / --seeds take comma-separated integers: {exc}")
    top = None
    if "top" in holds:
        if args.reference is None:
            sys.exit("--hold top needs --reference (a cell whose bundle excluded the top-magnitude coordinates)")
        top = {int(b): set(c) for b, c in read_manifest(args.reference / ROUTERS).get("excluded", {}).items()}
        if not top:
            sys.exit(f"{args.reference}: its bundle excluded no coordinates (exclude_top_magnitude 0)")
    labels = set(args.labels.split(","))
    cells = build_plan(load_study(args.config, scale=args.scale).config)
    chosen = [c for c in cells if c.method == "CRU" and c.label in labels and (seeds is None or c.seed in seeds)]
    if not chosen:
        sys.exit(f"no CRU cell of the plan has label {sorted(labels)}" + (f" and seed {sorted(seeds)}" if seeds else ""))
    stores = [CellStore(d) for d in args.dirs]
    command = " ".join(["python benchmarks/hold_gates_open.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [f"# Coordinates' gates held open in trained CRU bundles ({args.config.name}"
             f"{f', --scale {args.scale.name}' if args.scale else ''})", "",
             f"Written by `{command}`.", "",
             "Per cell: its numbers as the study recorded them; "
             + ("its unchanged bundle not evaluated again here (--no-recheck: another run of this script checked "
                "that this code gives the recorded numbers); " if args.no_recheck else
                "its unchanged bundle evaluated again by this code (it must equal the recorded row); ")
             + "each held set taken out of the selection (gate 1 on it, the other gates unchanged); and a control of "
             f"as many other selected coordinates per block drawn at random (seed {CONTROL_SEED}). Held: "
             "coordinates held open over all gated blocks"
             + (f"; top 1 %: per block the coordinates `{args.reference}` excluded ("
                + "; ".join(f"block {b}: {sorted(c)}" for b, c in sorted(top.items())) + ")" if top else "")
             + ". Degenerate: the forget answers' failure class (share).", "",
             "| cell | seed | bundle | held | " + " | ".join(name for name, _, _ in COLUMNS) + " | degenerate |",
             "|---|---|---|---|" + "---|" * len(COLUMNS) + "---|"]

    def emit(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    for cell in chosen:
        home = next((s for s in stores if (s.cell_dir(cell.hash) / ROUTERS / MANIFEST_NAME).is_file()), None)
        if home is None:
            print(f"skipped {cell.describe()}: no bundle in {[str(d) for d in args.dirs]}")
            continue
        bundle = RouterBundle.from_pretrained(home.cell_dir(cell.hash) / ROUTERS).eval()
        base_path = base_path_for(cell, cells, stores[0])
        retain = retain_cell_for(cell, cells)
        retain_result = None
        if retain is not None:
            retain_result = next((r for r in (s.load_result(retain.hash) for s in stores)
                                  if r and r.get("status") == "ok"), None)
        emit(row(cell, "as recorded", "0", home.load_result(cell.hash)))
        with tempfile.TemporaryDirectory() as tmp:
            variants = [] if args.no_recheck else [("unchanged, evaluated again", bundle, 0)]
            for coordinates in holds:
                if coordinates == "top":
                    held, control = held_sets(bundle, top, CONTROL_SEED)
                    name = "top 1 %"
                else:
                    held, control = held_sets(bundle, set(coordinates), CONTROL_SEED)
                    name = ",".join(map(str, coordinates))
                count = sum(map(len, held.values()))
                if not count:
                    print(f"{cell.describe()}: no block selected {name}; nothing to hold open")
                    continue
                variants.append((f"{name} held open", without_coordinates(bundle, held), count))
                variants.append((f"control for {name}: random selected", without_coordinates(bundle, control),
                                 sum(map(len, control.values()))))
            for i, (variant, routed, count) in enumerate(variants):
                emit(row(cell, variant, str(count), evaluate(cell, routed, base_path, retain_result,
                                                             Path(tmp) / str(i))))
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
