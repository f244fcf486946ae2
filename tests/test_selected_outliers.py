"""benchmarks/selected_outliers.py on hand-made cells: which top-magnitude coordinates each CRU cell gated."""
import json
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "selected_outliers.py"
TOP = {"2": [1, 7], "3": [0, 5]}


def make_cell(root, name, neurons, *, label="CRU-random", seed=0, mu=0.25, excluded=None, forget_sha="aa",
              base="results/x/cells/6ef25ac38b3d73a0/work/finetuned_model"):
    cell = root / "cells" / name
    (cell / "work" / "routers").mkdir(parents=True)
    manifest = {"base_model": base, "site_width": 8, "neurons": neurons, "selection": "random",
                "excluded": excluded or {}, "training": {"exclude_top_magnitude": 1},
                "training_data": {"forget": {"description": "forget01[:20]", "sha256_16": forget_sha}}}
    (cell / "work" / "routers" / "cru_bundle.json").write_text(json.dumps(manifest))
    (cell / "result.json").write_text(json.dumps({
        "label": label, "seed": seed, "metrics": {"model_utility": mu},
        "failure_classes": {"forget": {"degenerate": 0.5}}}))
    return cell


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=60)


def test_lists_the_top_magnitude_coordinates_each_cell_gated(tmp_path):
    ref = make_cell(tmp_path / "options", "ref", {"2": [1, 2], "3": [3, 4]}, excluded=TOP)
    study = tmp_path / "random_control"
    make_cell(study, "a", {"2": [0, 1, 4], "3": [1, 2, 3]}, seed=0, mu=0.0)
    make_cell(study, "b", {"2": [2, 3, 4], "3": [1, 2, 6]}, seed=1, mu=0.3)
    make_cell(study, "c", {"5": [1, 2, 3]}, seed=2)   # other blocks: no top set to compare with
    (study / "cells" / "d").mkdir()                   # a reference cell: no bundle
    (make_cell(study, "e", {"2": [1], "3": [0]}) / "result.json").unlink()   # still running: no result yet
    out = tmp_path / "out.md"
    proc = run("--reference", ref, study, "--out", out)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "base: finetune cell 6ef25ac38b3d73a0" in text and "block 2: [1, 7]; block 3: [0, 5]" in text
    assert "| random_control | CRU-random | 0 | random | 3 | 2: [1] | 0.00 | 0.50 |" in text
    assert "| random_control | CRU-random | 1 | random | 3 | none | 0.30 | 0.50 |" in text
    assert text.count("| random_control |") == 2


@pytest.mark.parametrize("cell, message", [
    ({"forget_sha": "bb"}, "trained on other forget data than the reference"),
    ({"base": "results/y/cells/0000000000000000/work/finetuned_model"},
     "differs from the reference's 'finetune cell 6ef25ac38b3d73a0'"),
])
def test_refuses_cells_unlike_the_reference(tmp_path, cell, message):
    ref = make_cell(tmp_path / "options", "ref", {"2": [1], "3": [3]}, excluded=TOP)
    study = tmp_path / "study"
    make_cell(study, "a", {"2": [1], "3": [0]}, **cell)
    proc = run("--reference", ref, study, "--out", tmp_path / "out.md")
    assert proc.returncode == 1 and message in proc.stderr
    assert not (tmp_path / "out.md").exists()


def test_refuses_a_reference_without_excluded_coordinates(tmp_path):
    ref = make_cell(tmp_path / "options", "ref", {"2": [1], "3": [3]})
    proc = run("--reference", ref, tmp_path, "--out", tmp_path / "out.md")
    assert proc.returncode == 1 and "excluded no coordinates" in proc.stderr
