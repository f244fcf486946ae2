"""`cru-harness report` on every committed run under results/ writes its committed report files again, byte for byte,
but for the one line docs/reproducibility.md allows: the one naming the checkout's code version (and so which cells
this checkout would recompute). Plots aside: their bytes follow the matplotlib version."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNS = sorted(str(p.parent.parent.relative_to(REPO)) for p in (REPO / "results").rglob("report/report.md"))
CHECKOUT_LINE = "This checkout's code version: "


def _files(root: Path) -> dict[Path, bytes]:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.suffix != ".png"}


def test_every_committed_run_is_checked():
    assert len(RUNS) >= 29 and "results/demo" in RUNS and "results/cpu_smollm2_forget01" in RUNS


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS)
def test_report_rewrites_the_committed_report_but_for_the_checkout_line(run, tmp_path, monkeypatch):
    from cru_harness.cli import main

    committed = REPO / run
    copy = tmp_path / run   # the same relative path: the report names its directory
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns("report", "study", "work"))
    for name in ("CRU_HARNESS_DATA_DIR", "CRU_HARNESS_TOFU_DIR", "CRU_HARNESS_RWKU_DIR"):
        monkeypatch.delenv(name, raising=False)   # a report says what its cells read, not this environment
    monkeypatch.chdir(tmp_path)
    assert main(["report", run, "--no-plots"]) == 0
    old, new = _files(committed / "report"), _files(copy / "report")
    assert sorted(old) == sorted(new), "a committed report file the report no longer writes, or a new one"
    for rel in old:
        if rel.name != "report.md":
            assert new[rel] == old[rel], rel
            continue
        before, after = old[rel].decode().splitlines(True), new[rel].decode().splitlines(True)
        assert len(before) == len(after), rel
        differing = [(a, b) for a, b in zip(before, after) if a != b]
        assert all(a.startswith(CHECKOUT_LINE) and b.startswith(CHECKOUT_LINE) for a, b in differing), differing[:1]
