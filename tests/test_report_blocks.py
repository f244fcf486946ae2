"""The report's blocks beyond the leaderboard's core: TOFU's privacy block (cells that ran `tofu_privacy_<split>`:
privleak against the retain oracle's Min-K% AUC, open-unlearning's default, and the attack that best tells forget
from holdout) and the robustness table of attack cells (recovery beside the oracle's change)."""
import json

import pytest

from cru_harness.benchmarks.tofu import BENCHMARK as TOFU
from cru_harness.metrics.privacy import privleak
from cru_harness.reporting import cell_scores, tables


def _results_file(directory, date, split, aucs):
    directory.mkdir(parents=True, exist_ok=True)
    results = {f"tofu_privacy_{split}": {f"{name},none": value for name, value in aucs.items()},
               "tofu_retain": {"rouge_l_recall,none": 0.5}}
    (directory / f"results_{date}.json").write_text(json.dumps({"results": results}))


def test_privacy_metrics_read_the_newest_results_of_the_split(tmp_path):
    _results_file(tmp_path / "a", "2026-01-01T00-00-00", "forget01", {"mia_min_k": 0.9, "mia_loss": 0.8})
    _results_file(tmp_path / "b", "2026-02-01T00-00-00", "forget01", {"mia_min_k": 0.7, "mia_loss": 0.6,
                                                                        "exact_memorization": 0.4})
    got = cell_scores.privacy_metrics(tmp_path, "forget01")
    assert got["mia_auc_min_k"] == 0.7 and got["mia_auc_loss"] == 0.6 and got["exact_memorization"] == 0.4
    assert got["mia_auc_zlib"] is None
    assert cell_scores.privacy_metrics(tmp_path, "forget10") == {}   # the task was not run: nothing recorded


def test_privleak_uses_the_retain_cells_auc_and_says_when_it_falls_back():
    value, details = cell_scores.privleak_of(0.8, 0.55)
    assert value == pytest.approx(((1 - 0.8) - (1 - 0.55)) / (1 - 0.55) * 100)
    assert value == pytest.approx(privleak(0.8, 0.55)) and details["retain_source"] == "retain cell"
    fallback, details = cell_scores.privleak_of(0.8, None)
    assert fallback == pytest.approx(privleak(0.8, 0.5)) and details["retain_auc"] == 0.5
    assert "no retain cell" in details["retain_source"]
    assert cell_scores.privleak_of(None, 0.5)[0] is None


def _result(label, privacy=None, kind="method"):
    metrics = {"forget_rouge_l": 0.5, "forget_prob": 0.5, "model_utility": 0.4, **(privacy or {})}
    return {"hash": label, "status": "ok", "kind": kind, "label": label, "method": label, "model": "m",
            "benchmark": "tofu", "split": "forget01", "target": None, "seed": 0, "metrics": metrics}


def test_the_leaderboard_shows_the_privacy_block_only_where_cells_have_it():
    metrics = {"mia_auc_loss": 0.45, "mia_auc_min_k": 0.8, "mia_auc_zlib": 0.3}
    TOFU.derive(metrics, {})
    assert metrics["mia_auc_best"] == 0.8          # the attack farthest from 0.5
    plain = [_result("Original", kind="original"), _result("GA"), _result("NPO")]
    rows = tables.aggregate(plain, "tofu")
    assert "privleak" not in tables.to_markdown(rows, "tofu") and "privleak" not in tables.to_csv(rows, "tofu")
    private = [_result("Original", {"privleak": -40.0, "mia_auc_min_k": 0.8}, kind="original"),
               _result("GA", {"privleak": 12.0, "mia_auc_min_k": 0.45}),
               _result("NPO", {"privleak": -5.0, "mia_auc_min_k": 0.52})]
    rows = tables.aggregate(private, "tofu")
    markdown = tables.to_markdown(rows, "tofu")
    assert "privleak →0" in markdown and "best MIA AUC →0.5" in markdown
    npo = next(r for r in rows if r["label"] == "NPO")
    assert "privleak" in npo["best"] and "mia_auc_best" in npo["best"]   # closest to 0, closest to 0.5
    assert "privleak" in tables.to_csv(rows, "tofu").splitlines()[0]


def _attack(label, attack, value, attacked_kind="method", seed=0):
    result = _result(f"{label} + {attack}", kind="attack")
    result.update(seed=seed, details={"attack": {"name": attack, "attacked_label": label, "attack_label": attack,
                                                 "attacked_kind": attacked_kind}})
    result["metrics"]["forget_rouge_l"] = value
    return result


def test_the_robustness_table_reads_recovery_beside_the_oracles_change():
    """Original 0.9, GA 0.3 (gap 0.6); relearn brings GA to 0.6 (recovery 0.5) and the oracle from 0.2 to 0.35
    (0.15 of the gap): 0.25 of GA's recovery is beyond what the attack teaches a model that never saw the set."""
    results = [_result("Original", kind="original"), _result("Retain", kind="retain"), _result("GA"),
               _attack("GA", "relearn", 0.6), _attack("Retain", "relearn", 0.35, attacked_kind="retain")]
    for r, value in zip(results[:3], (0.9, 0.2, 0.3)):
        r["metrics"]["forget_rouge_l"] = value
    rows = tables.robustness_rows(results, "tofu")
    assert [(r["label"], r["attack"]) for r in rows] == [("GA", "relearn")]   # the oracle is the control, not a row
    recovery = rows[0]["recovery"]
    assert recovery.score == pytest.approx(0.5) and recovery.oracle_score == pytest.approx(0.25)
    assert recovery.excess == pytest.approx(0.25)
    text = "\n".join(tables.robustness_markdown(results, "tofu"))
    assert "| m | forget01 | GA | relearn | 0.90 | 0.30 | 0.60 | 0.50 | 0.25 | 0.25 |" in text
    # attack cells are not leaderboard rows
    assert [r["label"] for r in tables.aggregate(results, "tofu")] == ["Original", "GA"]
