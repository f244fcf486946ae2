"""Reproduction verdict over the cells two runs share (by hash), for a run that recomputes part of another one
(`cru-harness run --reproduce` compares every cell of the reference, so the cells the run never planned would read
as missing). Writes the same markdown as `--reproduce`, listing the run's own cells as extra.
  python benchmarks/reproduce_shared_cells.py RUN_DIR REFERENCE_DIR OUT.md
"""
import sys
from dataclasses import replace
from pathlib import Path

from cru_harness.store import CellStore
from cru_harness.runner.reproduce import compare_runs, comparison_markdown, records_code


def main(run_dir: str, reference_dir: str, out: str) -> int:
    comparison = compare_runs(run_dir, reference_dir)
    shared = [cell for cell in comparison.cells if cell.status != "missing"]
    # the reference's code and commits: of the compared cells, not of every cell the reference holds
    versions, commits = records_code(CellStore(reference_dir).load_record(cell.hash) for cell in shared)
    comparison = replace(comparison, cells=shared, reference_code_versions=versions, reference_commits=commits)
    Path(out).write_text(comparison_markdown(comparison)
                         + f"\nOnly the {len(shared)} cells both runs hold are compared; the reference's other cells "
                           "were not part of this run.\n\nWritten by `python benchmarks/reproduce_shared_cells.py "
                           f"{run_dir} {reference_dir} {out}`.\n")
    print(comparison.verdict)
    return 0 if comparison.reproduced else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
