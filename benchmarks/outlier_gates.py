"""How each CRU cell of a study gates the blocks' top-magnitude coordinates, beside what the cell did.

A block's mean gate can hide the few gates that matter. In the lambda study (docs/findings.md) CRU at lambda >= 10
keeps the model at one seed and destroys it at others with the same mean gates (about 0.9 on forget and retain
tokens). This measures, per CRU cell, the routers' gate on each of the top 1 % coordinates by mean |activation| it
selected (the reference bundle's `excluded`, as in benchmarks/selected_outliers.py), averaged over the retain texts
its training read: on their first token, where such coordinates carry their largest values, and on the later
tokens; next to the same for the other selected coordinates, the cell's MU and its share of degenerate forget
answers. It needs the cells' work/ folders (bundles, fine-tuned checkpoint): run it where the study ran.

    python benchmarks/outlier_gates.py --reference CELL_DIR --config STUDY.yaml [--scale RUN.yaml] \
        STUDY_DIR [MORE_DIRS ...] --out FILE.md

A CRU cell's bundle is taken from the first directory holding it (a study can reuse cells another one trained);
the fine-tuned checkpoint from the first directory.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from cru_harness.cru.bundle import MANIFEST_NAME, RouterBundle, read_manifest
from cru_harness.store import WORK_DIR, CellStore
from cru_harness.runner.plan import build_plan
from cru_harness.runner.training import ROUTERS_DIR
from cru_harness.studies.analyses import load_cell_model, observe_gates
from cru_harness.studies.config import load_study
from cru_harness.studies.run import base_path_for

ROUTERS = Path(WORK_DIR) / ROUTERS_DIR   # where the runner keeps a CRU cell's bundle


class CoordinateGates:
    """Gate observer: per block, the sum of each selected coordinate's gate over first tokens and later tokens."""

    def __init__(self):
        self.mask = None
        self.sums: dict[int, list] = {}

    def __call__(self, block: int, _bundle, gates) -> None:
        gates = gates.detach().float().cpu()
        mask = self.mask.bool().cpu()
        later = mask.clone()
        later[:, 0] = False   # right padding: position 0 is every row's first token
        s = self.sums.setdefault(block, [0, torch.zeros(gates.shape[-1]), 0, torch.zeros(gates.shape[-1])])
        s[0] += gates.shape[0]
        s[1] += gates[:, 0, :].sum(0)
        s[2] += int(later.sum())
        s[3] += gates[later].sum(0)

    def means(self, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        n_first, first, n_later, later = self.sums[block]
        return first / n_first, later / n_later


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, required=True,
                        help="cell whose bundle was trained with exclude_top_magnitude (its manifest's `excluded`)")
    parser.add_argument("--config", type=Path, required=True, help="the study config the cells were planned by")
    parser.add_argument("--scale", type=Path, help="the --scale config the study ran with")
    parser.add_argument("dirs", type=Path, nargs="+", help="study output directories (with cells/)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    top = {int(b): set(c) for b, c in read_manifest(args.reference / ROUTERS)["excluded"].items()}
    if not top:
        sys.exit(f"{args.reference}: its bundle excluded no coordinates (exclude_top_magnitude 0)")
    cells = build_plan(load_study(args.config, scale=args.scale).config)
    stores = [CellStore(d) for d in args.dirs]
    command = " ".join(["python benchmarks/outlier_gates.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [f"# Gates on the top-magnitude coordinates ({args.config.name}"
             f"{f', --scale {args.scale.name}' if args.scale else ''})", "",
             f"Written by `{command}`.", "",
             "Mean gate over the retain texts the routers trained on, first token / later tokens: of the other "
             "selected coordinates (all gated blocks), and of each top 1 % magnitude coordinate the cell selected "
             f"(mean over the blocks that selected it; top set from `{args.reference}`: "
             + "; ".join(f"block {b}: {sorted(c)}" for b, c in sorted(top.items())) + ").", "",
             "| variant | seed | MU | forget degenerate | other selected coordinates | top-magnitude coordinates |",
             "|---|---|---|---|---|---|"]
    for cell in (c for c in cells if c.method == "CRU"):
        home = next((s for s in stores if (s.cell_dir(cell.hash) / ROUTERS / MANIFEST_NAME).is_file()), None)
        if home is None:
            print(f"skipped {cell.describe()}: no bundle in {[str(d) for d in args.dirs]}")
            continue
        bundle = RouterBundle.from_pretrained(home.cell_dir(cell.hash) / ROUTERS)
        if set(bundle.block_indices) != set(top):
            print(f"skipped {cell.describe()}: gates blocks {bundle.block_indices}, the reference names {sorted(top)}")
            continue
        model, tokenizer, _, retain, config = load_cell_model(cell, base_path_for(cell, cells, stores[0]))
        recorder = observe_gates(model, tokenizer, bundle, retain, CoordinateGates(), batch_size=config.batch_size,
                                 max_length=config.max_length)
        others_first, others_later, per_coordinate = [], [], {}
        for block in bundle.block_indices:
            first, later = recorder.means(block)
            neurons = bundle.neuron_indices(block).tolist()
            for i, coordinate in enumerate(neurons):
                if coordinate in top[block]:
                    per_coordinate.setdefault(coordinate, []).append((float(first[i]), float(later[i])))
                else:
                    others_first.append(float(first[i]))
                    others_later.append(float(later[i]))
        result = home.load_result(cell.hash)
        degenerate = (result.get("failure_classes") or {}).get("forget", {}).get("degenerate")
        others = (f"{sum(others_first) / len(others_first):.2f} / {sum(others_later) / len(others_later):.2f}"
                  if others_first else "–")
        tops = "; ".join(f"{c}: {sum(f for f, _ in v) / len(v):.2f} / {sum(l for _, l in v) / len(v):.2f}"
                         for c, v in sorted(per_coordinate.items())) or "none selected"
        lines.append(f"| {cell.label} | {cell.seed} | {result['metrics']['model_utility']:.2f} | "
                     f"{'–' if degenerate is None else f'{degenerate:.2f}'} | {others} | {tops} |")
        print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
