"""`cru-harness run configs/ci_minimal.yaml` for real: tiny Llama on the testbed world, Retain + Original + GA + CRU.

Everything is real (training, lm-eval through the `cru` model, the project scorers, the report); only the second
run replaces the executor with a tripwire (a test double) to prove that finished cells are skipped. About 30 s
with the tiny checkpoints cached (they are built on first use under CRU_HARNESS_CACHE: a few minutes more).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import torch

torch.set_num_threads(1)  # 2 shared cores: one thread is ~10x faster than two under contention

from cru_harness.cli import main  # noqa: E402
from cru_harness.runner import execute  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG = REPO_ROOT / "configs" / "ci_minimal.yaml"
TOFU_KEYS = [f"{s}_{m}" for s in ("forget", "retain", "ra", "wf") for m in ("rouge_l", "prob", "truth_ratio")]
FAILURE_CLASSES = {"correct", "refusal", "degenerate", "wrong"}


def _results(out: Path) -> dict[str, dict]:
    results = {}
    for path in sorted((out / "cells").glob("*/result.json")):
        result = json.loads(path.read_text())
        results[result["label"]] = result
    return results


@pytest.mark.slow
def test_ci_minimal_end_to_end_then_resume(tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert main(["run", str(CONFIG), "--output-dir", str(out)]) == 0

    results = _results(out)
    assert set(results) == {"Retain", "Original", "GA", "CRU"}
    for label, result in results.items():
        assert result["status"] == "ok", (label, result.get("reason"), result.get("error"))
        metrics = result["metrics"]
        for key in TOFU_KEYS + ["model_utility"]:
            assert isinstance(metrics.get(key), float) and math.isfinite(metrics[key]), (label, key, metrics)
        assert 0.0 < metrics["model_utility"] <= 1.0
        # the evaluation went through lm-eval's own output files, which the scorer read
        assert list(Path(result["artifacts"]["lmeval"]).rglob("results_*.json"))
        assert Path(result["artifacts"]["per_item"]).is_file()
        truth_ratios = result["per_item"]["forget_truth_ratio"]
        assert len(truth_ratios) == 8 and len(result["per_item"]["forget_question"]) == 8  # limit 8
        # failure classes of the forget answers, with the NLL under the original model
        fractions = result["failure_classes"]["forget"]
        assert set(fractions) == FAILURE_CLASSES and math.isclose(sum(fractions.values()), 1.0)
        forget_fm = result["details"]["scoring"]["failure_modes"]["forget"]
        assert forget_fm["mean_nll_original"] is not None and math.isfinite(forget_fm["mean_nll_original"])
        # tiny testbed checkpoints are trained on the plain template: no chat template, no system prompt
        assert result["details"]["prompting"] == {
            "apply_chat_template": False,
            "presets": {"tofu_preset": "open-unlearning", "tofu_model_family": None, "rwku_preset": "reference",
                        "rwku_newline_stop": False}}
        resources = result["resources"]
        assert resources["eval_wall_time_s"] > 0 and resources["cell_wall_time_s"] > 0
        assert resources["cell_peak_rss_bytes"] > 0
        record = json.loads((out / "cells" / result["hash"] / "run_record.json").read_text())
        assert record["status"] == "ok" and record["libraries"]["lm_eval"]

    # Forget Quality: KS test against the retain cell's per-item truth ratios (same items, by question)
    retain = results["Retain"]
    for label in ("Original", "GA", "CRU"):
        fq = results[label]["details"]["scoring"]["forget_quality"]
        assert fq["available"] and fq["retain_source"] == f"retain cell {retain['hash']}", fq
        assert fq["n_items"] == 8
        assert 0.0 < results[label]["metrics"]["forget_quality"] <= 1.0
    assert results["Retain"]["metrics"]["forget_quality"] is None  # the oracle is not scored against itself

    # the privacy block (TOFU's default tasks run tofu_privacy_<split>): five MIA AUCs, the reference attack
    # against the retain oracle's checkpoint, privleak against the oracle's Min-K% AUC
    for label in ("Original", "GA", "CRU"):
        metrics = results[label]["metrics"]
        for key in ("mia_auc_loss", "mia_auc_zlib", "mia_auc_min_k", "mia_auc_min_k_plus_plus", "mia_auc_gradnorm",
                    "mia_auc_reference", "extraction_strength"):
            assert isinstance(metrics.get(key), float) and 0.0 <= metrics[key] <= 1.0, (label, key, metrics.get(key))
        assert results[label]["details"]["privacy_reference"]["source"] == f"retain cell {retain['hash']}"
        assert metrics["privleak"] is not None
    assert "privacy_reference" not in results["Retain"]["details"]

    # training resources
    for label in ("GA", "CRU"):
        resources = results[label]["resources"]
        assert resources["train_wall_time_s"] > 0 and resources["trainable_params"] > 0
        assert resources["train_peak_memory_bytes"] > 0
    assert results["CRU"]["resources"]["trainable_params"] < results["GA"]["resources"]["trainable_params"]
    gates = results["CRU"]["gate_means"]
    assert 0.0 <= gates["forget"] <= 1.0 and 0.0 <= gates["retain"] <= 1.0

    # the report: a markdown leaderboard and plots
    report = out / "report"
    table = (report / "leaderboard_tofu.md").read_text()
    assert table.startswith("| Model |") and "| CRU |" in table and "| GA |" in table
    assert list((report / "plots").glob("*.png"))
    assert (report / "report.md").is_file() and (report / "resources.md").is_file()

    # re-running skips every finished cell: the executor is never called, no file is rewritten
    stamps = {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/*.json")}

    def tripwire(*args, **kwargs):  # test double: a finished cell must not be recomputed
        raise AssertionError("a finished cell was recomputed")

    monkeypatch.setattr(execute, "execute_cell", tripwire)
    assert main(["run", str(CONFIG), "--output-dir", str(out), "--no-report"]) == 0
    assert {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/*.json")} == stamps
    assert _results(out) == results

    # attacks: the identity attack on each finished method cell (reused from this run, not recomputed) scores
    # exactly what the cell scored, the CRU cell's with its bundle attached (else it would read as Original)
    monkeypatch.undo()
    import yaml

    attacked_config = tmp_path / "ci_minimal_attacked.yaml"
    attacked_config.write_text(yaml.safe_dump({**yaml.safe_load(CONFIG.read_text()), "attacks": ["identity"]}))
    attacked_out = tmp_path / "attacked"
    assert main(["run", str(attacked_config), "--output-dir", str(attacked_out), "--reuse", str(out),
                 "--no-report"]) == 0
    attacked = _results(attacked_out)
    # the oracle and the Original are attacked too: the controls (what the attack teaches a model that never saw
    # the forget set, and what it does to the model before unlearning)
    assert set(attacked) == set(results) | {"GA + identity", "CRU + identity", "Retain + identity",
                                            "Original + identity"}
    for label in ("GA", "CRU", "Retain", "Original"):
        attack = attacked[f"{label} + identity"]
        assert attack["status"] == "ok" and attack["kind"] == "attack", attack.get("error")
        assert attack["details"]["attack"]["attacked"] == results[label]["hash"]
        for key in ("forget_rouge_l", "forget_prob", "model_utility"):
            assert attack["metrics"][key] == results[label]["metrics"][key], (label, key)
    assert attacked["CRU + identity"]["metrics"]["forget_prob"] != results["Original"]["metrics"]["forget_prob"]
    # the robustness table pairs each attack cell with the cell its record names: the identity attack closes none
    # of the gap, and the oracle's own change is none
    from cru_harness.reporting import tables

    rows = {r["label"]: r for r in tables.robustness_rows(list(attacked.values()), "tofu")}
    assert set(rows) == {"GA", "CRU"} and all(r["n"] == 1 for r in rows.values())
    for row in rows.values():
        assert row["after"] == row["before"] and row["recovery"].oracle_change == 0
        assert row["recovery"].score in (0, None)   # None only where unlearning left no gap
