"""The studies of CRU's untested readings (issue 77, part 3): configs/studies/cru_readings_cpu.yaml (gate gap) and
cru_readings_overlap_cpu.yaml (forward-only overlap), their `paper: true` summary beside the paper's figures, and
both end to end on the tiny testbed (the overlap one is forward-only and fast; the gate-gap one trains, slow)."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
import yaml

from cru_harness.cli import main
from cru_harness.runner.config import ConfigError
from cru_harness.runner.plan import build_plan
from cru_harness.studies.config import load_study, validate_study

from test_studies import STUDIES, tiny_study

torch.set_num_threads(1)

ARMS = {"CRU-answer-scope": {"token_scope": "answer"},
        "CRU-content-localization": {"localization_tokens": "content"},
        "CRU-hf-hidden-states": {"block_output": "hf_hidden_states"}}


def _csv(path: Path) -> list[dict]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def test_gate_gap_study_runs_each_reading_beside_the_options_reports_paper_cell():
    study = load_study(STUDIES / "cru_readings_cpu.yaml")
    assert study.spec.kind == "gate_gap" and study.spec.paper and study.config.seeds == (0, 1, 2)
    report = load_study(STUDIES / "options_report_forget01_cpu.yaml")
    ours = {c.label: c for c in build_plan(study.config) if c.kind == "method" and c.seed == 0}
    theirs = {c.label: c for c in build_plan(report.config) if c.kind == "method" and c.seed == 0}
    assert ours["CRU"].hash == theirs["CRU"].hash           # the paper setting is that report's cell
    for label, option in ARMS.items():   # one reading changed at a time, at forget01's whole CPU size
        assert ours[label].hparams == {**ours["CRU"].hparams, **option}
        assert ours[label].corpora == {"forget_corpus": "forget01", "retain_corpus": "retain99[:40]"}
        assert ours[label].limit == 40


def test_overlap_study_compares_the_localization_readings():
    study = load_study(STUDIES / "cru_readings_overlap_cpu.yaml")
    assert study.spec.kind == "overlap" and study.spec.paper and study.spec.examples == (40,)
    hparams = {m.label: m.hparams for m in study.config.methods}
    assert hparams["CRU-p95-content"] == {**hparams["CRU-p95"], "localization_tokens": "content"}
    assert hparams["CRU-p95-hf"] == {**hparams["CRU-p95"], "block_output": "hf_hidden_states"}


@pytest.mark.parametrize("name", ["cru_readings_cpu", "cru_readings_overlap_cpu"])
def test_the_reading_studies_dry_run(name, capsys):
    assert main(["study", str(STUDIES / f"{name}.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    if name == "cru_readings_cpu":   # each arm's cells, with the option they train under
        assert "token_scope=answer" in out
        assert "block_output=hf_hidden_states" in out and "localization_tokens=content" in out
    else:                            # forward-only: 3 readings x 3 seeds localized, nothing trained
        assert "9 CRU cells localized" in out and "CRU-p95-hf seed=2" in out


def test_paper_is_only_for_the_analyses_that_have_a_paper_figure():
    raw = yaml.safe_load((STUDIES / "cru_readings_overlap_cpu.yaml").read_text())
    raw["study"] = {**raw["study"], "kind": "sweep"}
    with pytest.raises(ConfigError, match="study.paper"):
        validate_study(raw)
    raw["study"] = {**raw["study"], "kind": "overlap", "paper": "yes"}
    with pytest.raises(ConfigError, match="study.paper"):
        validate_study(raw)


def test_overlap_readings_end_to_end_with_the_paper_summary(tmp_path):
    out = tmp_path / "cru_readings_overlap_cpu"
    config = tiny_study("cru_readings_overlap_cpu", out, keep=["CRU-p95", "CRU-p95-content", "CRU-p95-hf"])
    assert main(["study", str(config)]) == 0
    rows = _csv(out / "study" / "table.csv")
    by = {(r["variant"], r["examples"], r["block"]): r for r in rows}
    blocks = sorted({int(r["block"]) for r in rows})
    last = str(blocks[-1])
    # the HF reading differs from the block reading at the last block only (read after the final norm)
    for block in map(str, blocks[:-1]):
        assert by[("CRU-p95-hf", "10", block)]["rho_mean"] == by[("CRU-p95", "10", block)]["rho_mean"]
    assert by[("CRU-p95-hf", "10", last)]["rho_mean"] != by[("CRU-p95", "10", last)]["rho_mean"]
    # content pooling changes the variances of every block
    assert all(by[("CRU-p95-content", "10", str(b))]["rho_mean"] != by[("CRU-p95", "10", str(b))]["rho_mean"]
               for b in blocks)
    summary = _csv(out / "study" / "paper.csv")
    assert {(r["variant"], r["examples"]) for r in summary} == \
        {(v, n) for v in ("CRU-p95", "CRU-p95-content", "CRU-p95-hf") for n in ("10", "all")}
    mean_last4 = sum(float(by[("CRU-p95", "10", str(b))]["overlap_mean"]) for b in blocks[-4:]) / 4
    row = next(r for r in summary if (r["variant"], r["examples"]) == ("CRU-p95", "10"))
    assert float(row["overlap_mean"]) == pytest.approx(mean_last4)
    text = (out / "study" / "paper.md").read_text()
    assert "the paper: TOFU forget01" in text and "0.27 (Llama)" in text


@pytest.mark.slow
def test_gate_gap_readings_end_to_end_train_evaluate_and_summarise(tmp_path):
    """Every arm trains, is evaluated by lm-eval with its routers attached (the answer scope found in lm-eval's
    requests), and is measured token by token; paper.md shows the gap of block 'all'."""
    out = tmp_path / "cru_readings_cpu"
    config = tiny_study("cru_readings_cpu", out, keep=["CRU", *ARMS])
    assert main(["study", str(config)]) == 0
    gaps = {r["variant"]: r for r in _csv(out / "study" / "paper.csv")}
    assert set(gaps) == {"CRU", *ARMS}
    for row in gaps.values():
        assert float(row["gap_mean"]) == pytest.approx(float(row["retain_mean"]) - float(row["forget_mean"]))
    table = {r["variant"]: r for r in _csv(out / "study" / "table.csv")}
    assert set(table) >= {"CRU", *ARMS}
    assert "the paper: TOFU forget10" in (out / "study" / "paper.md").read_text()
