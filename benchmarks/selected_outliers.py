"""Which extreme-magnitude coordinates each CRU cell of a study gated, beside what the cell did to the model.

The percentile and random-control readings (docs/findings.md) point at a few coordinates that every answer
depends on. This lists, per CRU cell, the selected coordinates among each block's top 1 % by mean |activation|
over the forget texts, as the package computed them for a bundle trained with `exclude_top_magnitude` on the
same base model and forget data (its manifest's `excluded`), next to the cell's MU and share of degenerate
forget answers. The bundles live in the cells' work/ folders (git-ignored): run it where the study ran.

    python benchmarks/selected_outliers.py --reference CELL_DIR STUDY_DIR [STUDY_DIR ...] --out FILE.md
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cru_harness.cru.bundle import MANIFEST_NAME, read_manifest
from cru_harness.store import CELLS_DIR, WORK_DIR
from cru_harness.runner.training import FINETUNED_DIR, ROUTERS_DIR

ROUTERS = Path(WORK_DIR) / ROUTERS_DIR   # where the runner keeps a CRU cell's bundle


def manifest(cell_dir: Path) -> dict:
    return read_manifest(cell_dir / ROUTERS)


def base_model(m: dict) -> str:
    """The bundle's base: a runner's fine-tuned checkpoint is named by its finetune cell's hash, since two studies
    keep the same cell's checkpoint under different directories."""
    path = Path(m["base_model"])   # <run>/cells/<hash>/work/<FINETUNED_DIR>
    if len(path.parts) >= 4 and path.name == FINETUNED_DIR and path.parent.name == WORK_DIR \
            and path.parents[2].name == CELLS_DIR:
        return f"finetune cell {path.parents[1].name}"
    return m["base_model"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, required=True,
                        help="cell whose bundle was trained with exclude_top_magnitude (its manifest's `excluded`)")
    parser.add_argument("studies", type=Path, nargs="+", help="study output directories (with cells/)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    ref = manifest(args.reference)
    top = {block: set(coords) for block, coords in ref["excluded"].items()}
    if not top:
        sys.exit(f"{args.reference}: its bundle excluded no coordinates (exclude_top_magnitude 0)")
    command = " ".join(["python benchmarks/selected_outliers.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [f"# Top-magnitude coordinates gated by each CRU cell ({', '.join(str(s) for s in args.studies)})", "",
             f"Written by `{command}`.", "",
             f"Top {ref['training']['exclude_top_magnitude']} % by mean |activation| per block, from the bundle of "
             f"`{args.reference}` (base: {base_model(ref)}, forget data "
             f"`{ref['training_data']['forget']['description']}`): "
             + "; ".join(f"block {b}: {sorted(c)}" for b, c in sorted(top.items())) + ".", "",
             "| study | variant | seed | selection | coordinates per block | top-magnitude coordinates gated "
             "| MU | forget degenerate |", "|---|---|---|---|---|---|---|---|"]
    for study in args.studies:
        rows = []
        for cell in sorted((study / "cells").iterdir()):
            if not (cell / ROUTERS / MANIFEST_NAME).is_file() or not (cell / "result.json").is_file():
                continue   # a reference cell (no routers), or one still running
            m, result = manifest(cell), json.loads((cell / "result.json").read_text())
            if base_model(m) != base_model(ref) or m["site_width"] != ref["site_width"]:
                sys.exit(f"{cell}: base {base_model(m)!r} (width {m['site_width']}) differs from the reference's "
                         f"{base_model(ref)!r} (width {ref['site_width']})")
            if m["training_data"]["forget"]["sha256_16"] != ref["training_data"]["forget"]["sha256_16"]:
                sys.exit(f"{cell}: trained on other forget data than the reference")
            if set(m["neurons"]) != set(top):
                continue  # other blocks (the blocks study): the reference names no top set for them
            hits = {b: sorted(set(m["neurons"][b]) & top[b]) for b in sorted(top)}
            gated = "; ".join(f"{b}: {c}" for b, c in hits.items() if c) or "none"
            sizes = sorted({len(v) for v in m["neurons"].values()})
            degenerate = (result.get("failure_classes") or {}).get("forget", {}).get("degenerate")
            rows.append((result["label"], result["seed"], m["selection"], "/".join(map(str, sizes)), gated,
                         result["metrics"]["model_utility"], degenerate))
        for label, seed, selection, sizes, gated, mu, degenerate in sorted(rows):
            lines.append(f"| {study.name} | {label} | {seed} | {selection} | {sizes} | {gated} | {mu:.2f} | "
                         f"{'–' if degenerate is None else f'{degenerate:.2f}'} |")
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
