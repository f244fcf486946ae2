"""The `muse` benchmark through the runner: config checks, plan, dry runs of the shipped configs, and a tiny
end-to-end CPU run on the fictitious fixture (tests/muse_fixture.py) with two methods."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from cru_harness.cli import main

from muse_fixture import write_muse_fixture

REPO = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path, data_dir: Path | None, **block) -> Path:
    raw = {
        "name": "muse_tiny", "output_dir": str(tmp_path / "out"), "seeds": [0], "device": "cpu",
        "models": [{"name": "tiny-llama", "path": "zoo:llama:finetuned", "dtype": "float32",
                    "retain": {"checkpoint": "zoo:llama:retain"}, "benchmarks": ["muse"]}],
        "benchmarks": {"muse": {"corpora": ["news"], "limit": 4, **block,
                                **({"data_dir": str(data_dir)} if data_dir else {})}},
        "methods": [{"method": "GA", "learning_rate": 1.0e-4, "num_epochs": 1, "effective_batch_size": 4,
                     "micro_batch_size": 4, "max_length": 64},
                    {"method": "NPO", "learning_rate": 1.0e-4, "num_epochs": 1, "effective_batch_size": 4,
                     "micro_batch_size": 4, "max_length": 64}],
        "evaluation": {"batch_size": 8, "max_gen_toks": 8},
        "report": {"formats": ["md"]},
    }
    path = tmp_path / "muse.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _plan(path: Path, capsys) -> dict:
    assert main(["run", str(path), "--dry-run", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_units_settings_and_corpora_in_the_plan(tmp_path, capsys):
    from cru_harness.runner import config as cfg
    from cru_harness.runner.plan import build_plan

    path = _config(tmp_path, write_muse_fixture(tmp_path / "muse"), scalability=[2, 4])
    assert _plan(path, capsys)["problems"] == []
    cells = build_plan(cfg.load_config(path))
    assert {c.split for c in cells} == {"news", "news_scal_2", "news_scal_4"}
    ga = next(c for c in cells if c.method == "GA" and c.split == "news_scal_2")
    assert ga.corpora == {"forget_corpus": "muse:news:scal:forget_2", "retain_corpus": "muse:news:retain1"}
    # MUSE's settings enter the cell below the config's own values (lr, epochs, batch, length from the config)
    assert ga.hparams["lr_scheduler"] == "constant" and ga.hparams["weight_decay"] == 0.0
    assert ga.hparams["learning_rate"] == 1.0e-4 and ga.hparams["num_epochs"] == 1
    npo = next(c for c in cells if c.method == "NPO" and c.split == "news")
    assert npo.hparams["alpha"] == 0.0   # MUSE's NPO has no retain term
    assert all(tuple(c.tasks) == ("muse_news_verbmem_f", "muse_news_knowmem_f", "muse_news_knowmem_r",
                                  "muse_news_privleak") for c in cells)
    shipped = build_plan(cfg.load_config(REPO / "configs" / "muse_news.yaml"))
    epochs = {(c.label or c.method): c.hparams.get("num_epochs") for c in shipped if c.kind == "method"
              and c.split == "news"}
    # MUSE's News epochs per method (baselines/scripts/unlearn_news_scal.sh)
    assert {k: epochs[k] for k in ("GA", "GA_GDR", "GA_KLR", "NPO", "NPO_GDR", "NPO_KLR")} == \
        {"GA": 1, "GA_GDR": 7, "GA_KLR": 10, "NPO": 1, "NPO_GDR": 10, "NPO_KLR": 10}
    # scalability: folds 2-4 (fold 1 is the news cell); Task Vector and WHP fine-tune on MUSE's 2048-token blocks
    # with their own MUSE defaults (10 epochs, cosine)
    assert {c.split for c in shipped} >= {"news_scal_2", "news_scal_3", "news_scal_4"}
    assert "news_scal_1" not in {c.split for c in shipped}
    for name in ("TaskVector", "WHP"):
        cell = next(c for c in shipped if c.method == name and c.split == "news")
        assert cell.hparams["max_length"] == 2048 and "num_epochs" not in cell.hparams
        assert cell.hparams["effective_batch_size"] == 4
    # MUSE's batch: 4 blocks a step (one model-parallel process; 102 steps an epoch on News), 2048-token blocks
    ga_news = next(c for c in shipped if c.method == "GA" and c.split == "news")
    assert ga_news.hparams["effective_batch_size"] == 4 and ga_news.hparams["max_length"] == 2048
    assert ga_news.hparams["learning_rate"] == 1e-5 and ga_news.hparams["lr_scheduler"] == "constant"


def test_sustainability_chains_each_request_on_the_previous_result(tmp_path):
    from cru_harness.runner import config as cfg
    from cru_harness.runner.plan import build_plan

    path = _config(tmp_path, write_muse_fixture(tmp_path / "muse"), sustainability=True)
    cells = build_plan(cfg.load_config(path))
    by = {(c.split, c.label): c for c in cells if c.kind == "method"}
    assert {s for s, _ in by} == {"news", "news_sust_2", "news_sust_3", "news_sust_4"}
    for label in ("GA", "NPO"):
        assert "continues" not in by[("news", label)].extra
        assert by[("news_sust_2", label)].extra["continues"] == by[("news", label)].hash
        assert by[("news_sust_3", label)].extra["continues"] == by[("news_sust_2", label)].hash
        assert by[("news_sust_4", label)].extra["continues"] == by[("news_sust_3", label)].hash
        assert by[("news_sust_3", label)].corpora["forget_corpus"] == "muse:news:sust:forget_3"
    # a sequel's hash follows the cell it continues: another setting of fold 2 moves fold 3
    raw = yaml.safe_load(path.read_text())
    raw["methods"][0]["learning_rate"] = 2.0e-4
    path.write_text(yaml.safe_dump(raw))
    moved = {(c.split, c.label): c for c in build_plan(cfg.load_config(path)) if c.kind == "method"}
    assert moved[("news_sust_4", "GA")].hash != by[("news_sust_4", "GA")].hash
    assert moved[("news_sust_4", "NPO")].hash == by[("news_sust_4", "NPO")].hash


@pytest.mark.parametrize("block, key, message", [
    ({"corpora": ["wiki"]}, "benchmarks.muse.corpora[0]", "expected one of news, books"),
    ({"scalability": [5]}, "benchmarks.muse.scalability[0]", "expected a fold in"),
    ({"scalability": [1, 2]}, "benchmarks.muse.scalability[0]", "expected a fold in [2, 3, 4]"),
    ({"sustainability": [3, 4]}, "benchmarks.muse.sustainability", "follow one another from 2"),
    ({"sustainability": [1]}, "benchmarks.muse.sustainability[0]", "expected a fold in [2, 3, 4]"),
])
def test_bad_blocks_name_the_key(tmp_path, capsys, block, key, message):
    path = _config(tmp_path, None, **block)
    assert main(["run", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert key in err and message in err and "Traceback" not in err


@pytest.mark.parametrize("name", ["muse_news.yaml", "muse_books.yaml"])
def test_shipped_configs_plan_muses_runs(name, capsys):
    plan = _plan(REPO / "configs" / name, capsys)
    assert plan["problems"] == [] and any(c["kind"] == "retain" for c in plan["cells"])
    labels = {c["cell"].split(" | ")[2].split(" seed")[0] for c in plan["cells"] if c["kind"] == "method"}
    assert labels == {"GA", "GA_GDR", "GA_KLR", "NPO", "NPO_GDR", "NPO_KLR", "TaskVector", "WHP"}
    sequels = {c["cell"].split(" | ")[2].split(" seed")[0] for c in plan["cells"]
               if c["kind"] == "method" and "_sust_" in c["cell"]}
    # WHP's model is two checkpoints: nothing to continue from, so no sequel (News only: Books has no sust folds)
    assert sequels == (labels - {"WHP"} if name == "muse_news.yaml" else set())


def test_run_without_data_is_one_clear_line(tmp_path, capsys, monkeypatch):
    """No local copy and no Hub: the run stops at its first cell's data with the Hub dataset and the local options."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("CRU_HARNESS_MUSE_DIR", raising=False)
    monkeypatch.delenv("CRU_HARNESS_DATA_DIR", raising=False)
    from cru_harness.benchmarks.muse import data as muse_data

    with pytest.raises(Exception) as err:
        muse_data.load_split("news", "raw", "forget")
    assert "muse-bench/MUSE-News" in str(err.value) and "CRU_HARNESS_MUSE_DIR" in str(err.value)


@pytest.mark.slow
def test_tiny_muse_run_end_to_end(tmp_path):
    """`cru-harness run` on the fixture: Retrain (oracle), Original, GA and NPO cells with MUSE's four numbers, and
    MUSE's table in the report."""
    import torch

    torch.set_num_threads(1)
    path = _config(tmp_path, write_muse_fixture(tmp_path / "muse"), sustainability=[2])
    assert main(["run", str(path)]) == 0
    results = {}
    for result_path in (tmp_path / "out" / "cells").glob("*/result.json"):
        result = json.loads(result_path.read_text())
        results[(result["label"], result["split"])] = result
    assert {("GA", "news"), ("NPO", "news"), ("GA", "news_sust_2"), ("NPO", "news_sust_2")} <= set(results)
    assert any(r["kind"] == "retain" for r in results.values())
    # fold 2 trained from fold 1's unlearned model, not from the target
    fold2 = results[("GA", "news_sust_2")]
    assert fold2["details"].get("started_from") == results[("GA", "news")]["artifacts"]["model"]
    for label, result in results.items():
        assert result["status"] == "ok", (label, result.get("error"))
        metrics = result["metrics"]
        for key in ("verbmem_f", "knowmem_f", "knowmem_r", "privleak_auc", "privleak"):
            assert isinstance(metrics.get(key), float) and math.isfinite(metrics[key]), (label, key, metrics)
    oracle = next(r for r in results.values() if r["kind"] == "retain")
    assert oracle["metrics"]["privleak"] == 0.0
    report = (tmp_path / "out" / "report" / "report.md").read_text()
    table = report[report.index("### MUSE: the six criteria"):]
    for row in ("Retrain (oracle)", "Original (target)", "GA", "NPO"):
        assert f"| tiny-llama | news | {row} |" in table, row
    assert "Sustainability: KnowMem on the retain set" in table
    muse_section = report[report.index("## MUSE"):]
    assert "Regime check" not in muse_section   # TOFU's check reads forget ROUGE-L, which MUSE does not score


def _result(kind, label, split="news", **metrics):
    return {"benchmark": "muse", "status": "ok", "model": "m", "split": split, "kind": kind, "label": label,
            "method": None if kind != "method" else label, "metrics": metrics}


def test_muse_table_marks_each_criterion_against_the_oracle_and_the_target():
    from cru_harness.benchmarks.muse.plugin import BENCHMARK

    results = [
        _result("retain", "Retain", verbmem_f=20.0, knowmem_f=30.0, privleak=0.0, knowmem_r=50.0),
        _result("original", "Original", verbmem_f=60.0, knowmem_f=60.0, privleak=-90.0, knowmem_r=55.0),
        _result("method", "GA", verbmem_f=10.0, knowmem_f=35.0, privleak=4.0, knowmem_r=49.6),
        _result("method", "NPO", verbmem_f=21.0, knowmem_f=5.0, privleak=-30.0, knowmem_r=40.0),
        _result("method", "GA", split="news_scal_2", verbmem_f=1.0, knowmem_f=1.0, privleak=1.0, knowmem_r=33.0),
    ]
    lines = BENCHMARK.report_lines(results, "table")
    assert BENCHMARK.report_lines(results, "robustness") == []
    main = lines[:next(i for i, line in enumerate(lines) if line.startswith("Scalability"))]
    rows = {line.split(" | ")[2]: line for line in main if line.startswith("| m | news |")}
    assert "| m | news_scal_2 | GA |" in "\n".join(main)
    # GA: VerbMem 10 <= 20 pass, KnowMem 35 > 30 fail, |4| <= 5 pass, 49.6 >= 0.9 * 55 = 49.5 pass
    assert rows["GA"].endswith("| ✓ | ✗ | ✓ | ✓ |")
    assert rows["NPO"].endswith("| ✗ | ✓ | ✗ | ✗ |")
    assert rows["Retrain (oracle)"].endswith("| — | — | — | — |")
    scal = lines[-1]
    # fold 1 is the corpus unit's cell (MUSE's scal/forget_1 is its raw forget split; unlearn_news_scal.sh runs 2-4)
    assert scal == "| m | news | GA | 49.6 | 33.0 | — | — |"
    assert BENCHMARK.report_lines([{**results[0], "benchmark": "tofu"}], "table") == []


def test_privleak_is_measured_against_the_oracle_auc():
    from cru_harness.benchmarks.muse.plugin import BENCHMARK

    oracle = _result("retain", "Retain", privleak_auc=0.5)
    cell = _result("method", "GA", privleak_auc=0.2, privleak=-58.0)
    BENCHMARK.compare_to_oracle(cell, oracle)
    assert cell["metrics"]["privleak"] == pytest.approx((0.2 - 0.5) / 0.5 * 100)
    BENCHMARK.compare_to_oracle(oracle, oracle)
    assert oracle["metrics"]["privleak"] == 0.0
    kept = _result("method", "GA", privleak_auc=0.2, privleak=-58.0)
    BENCHMARK.compare_to_oracle(kept, None)   # no oracle: the value scored against MUSE's published AUC stays
    assert kept["metrics"]["privleak"] == -58.0


def test_cell_score_headlines_are_muses_f1_with_recall_beside(tmp_path):
    """The cell's KnowMem / VerbMem are the mean ROUGE-L F1 x 100, MUSE's `agg['mean_rougeL'] * 100` (eval.py:65,
    :95, :112; logger.py:23 `rougeL` = fmeasure); the recall is recorded beside it, never in its place. PrivLeak is
    (AUC - AUC_retrain) / AUC_retrain x 100 on forget (label 0) vs holdout (label 1)."""
    from types import SimpleNamespace

    from cru_harness.benchmarks.muse import metrics as muse_metrics
    from cru_harness.benchmarks.muse.plugin import BENCHMARK

    rows = {"knowmem_f": [(0.5, 1.0), (0.25, 0.5)], "knowmem_r": [(0.8, 0.9)], "verbmem_f": [(0.1, 0.3), (0.3, 0.3)]}
    for key, values in rows.items():
        (tmp_path / f"samples_muse_news_{key}_2024-01-01T00-00-00.jsonl").write_text(
            "".join(json.dumps({"rougeL_f1": f, "rougeL_recall": r}) + "\n" for f, r in values))
    items = [{"member": False, "score": 2.0}, {"member": False, "score": 3.0}, {"member": True, "score": 2.5},
             {"member": True, "score": 4.0}]
    (tmp_path / "samples_muse_news_privleak_2024-01-01T00-00-00.jsonl").write_text(
        "".join(json.dumps({"auc": i}) + "\n" for i in items))
    cell = SimpleNamespace(split="news", kind="method")
    out = BENCHMARK.score(cell, tmp_path, data_dir=None, original_model=None, retain_result=None, device="cpu",
                          batch_size=1)["metrics"]
    assert out["knowmem_f"] == pytest.approx(37.5) and out["knowmem_f_recall"] == pytest.approx(75.0)
    assert out["knowmem_r"] == pytest.approx(80.0) and out["verbmem_f"] == pytest.approx(20.0)
    # holdout scores (loss-like) 2.5, 4.0 vs forget 2.0, 3.0: P(a holdout text looks more likely) = 1/4
    assert out["privleak_auc"] == pytest.approx(0.25)
    assert out["privleak"] == pytest.approx((0.25 - muse_metrics.MUSE_RETRAIN_AUC["news"])
                                            / muse_metrics.MUSE_RETRAIN_AUC["news"] * 100)
