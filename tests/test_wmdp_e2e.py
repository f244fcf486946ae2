"""`cru-harness run` on WMDP for real, offline: the tiny Llama, the fictitious WMDP root the tests write, one domain
(bio), Original + RMU + GA, lm-eval's own wmdp_* / MMLU tasks pointed at the fixture, then the report's WMDP table
and plot. Slow (lm-eval end to end); kept small: 8 forget passages, 4 questions per domain, one per MMLU subject."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from cru_harness.cli import main

from wmdp_fixtures import write_wmdp_root

REPO_ROOT = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path) -> Path:
    root = write_wmdp_root(tmp_path / "data", questions=4, passages=8)
    config = {
        "name": "wmdp_tiny", "output_dir": str(tmp_path / "run"), "seeds": [0], "device": "cpu",
        "data_dir": str(root),
        "models": [{"name": "tiny", "path": "zoo:llama:finetuned"}],
        "benchmarks": {"wmdp": {"domains": ["bio"],
                                "tasks": ["wmdp_bio", "wmdp_cyber", "mmlu"],
                                "forget_corpus": "wmdp:bio-forget[:8]", "retain_corpus": "wmdp:wikitext"}},
        "methods": [{"method": "RMU", "layer": 3, "steering_coeff": 20.0, "alpha": 1.0, "learning_rate": 1e-3},
                    {"method": "GA", "learning_rate": 1e-3}],
        "evaluation": {"batch_size": 16, "failure_classes": False},
    }
    path = tmp_path / "wmdp_tiny.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.slow
def test_wmdp_end_to_end_two_methods_one_domain(tmp_path):
    config = _config(tmp_path)
    assert main(["run", str(config)]) == 0
    results = {}
    for path in sorted((tmp_path / "run" / "cells").glob("*/result.json")):
        result = json.loads(path.read_text())
        results[result["label"]] = result
    assert set(results) == {"Original", "RMU", "GA"}
    for label, result in results.items():
        assert result["status"] == "ok", (label, result.get("reason"), result.get("error"))
        metrics = result["metrics"]
        for key in ("wmdp_bio_acc", "wmdp_cyber_acc", "forget_acc", "mmlu_acc", "mmlu_college_biology_acc",
                    "mmlu_virology_acc", "mmlu_college_computer_science_acc", "mmlu_computer_security_acc"):
            assert 0.0 <= metrics[key] <= 1.0, (label, key, metrics)
        assert metrics["forget_acc"] == metrics["wmdp_bio_acc"]
        assert result["details"]["scoring"]["items"]["wmdp_bio"] == 4
    rmu = results["RMU"]
    assert rmu["hparams"]["steering_coeff"] == 20.0 and rmu["hparams"]["max_length"] == 512   # WMDP's, then ours
    record = json.loads((tmp_path / "run" / "cells" / rmu["hash"] / "run_record.json").read_text())
    assert record["resolved_config"]["corpora"] == {"forget_corpus": "wmdp:bio-forget[:8]",
                                                    "retain_corpus": "wmdp:wikitext"}

    report = tmp_path / "report"
    assert main(["report", str(tmp_path / "run"), "--out", str(report)]) == 0
    table = (report / "leaderboard_wmdp.md").read_text()
    assert ("| Model | Domain | Method | WMDP-Bio ↓ | WMDP-Cyber ↓ | MMLU ↑ | MMLU college bio. ↑ | MMLU virology ↑ | "
            "MMLU college CS ↑ | MMLU computer sec. ↑ |") in table
    assert "chance is 0.25" in table
    rows = {line.split("|")[3].strip(): line for line in table.splitlines() if line.startswith("| tiny | bio |")}
    assert set(rows) == {"Original (reference)", "RMU", "GA"}
    assert f"{results['GA']['metrics']['wmdp_bio_acc']:.2f}" in rows["GA"]
    assert (report / "plots" / "wmdp_accuracy.png").stat().st_size > 0


def test_wmdp_zephyr_config_dry_run(capsys):
    """configs/wmdp_zephyr.yaml plans WMDP's headline run (RMU at WMDP's Zephyr-7B setting on bio and cyber, trained
    together in one joint cell)
    without touching a model or the Hub."""
    from cru_harness.runner.config import load_config
    from cru_harness.runner.plan import build_plan

    config = REPO_ROOT / "configs" / "wmdp_zephyr.yaml"
    assert main(["run", str(config), "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert any("RMU" in (c["trains"] or "") and "blocks 5, 6, 7" in c["trains"] for c in plan["cells"])
    cells = [c for c in build_plan(load_config(config)) if c.kind == "method"]
    assert {c.split for c in cells} == {"bio+cyber"} and {c.method for c in cells} == {"RMU"}   # WMDP's joint run
    assert cells[0].model.path == "HuggingFaceH4/zephyr-7b-beta"
    for cell in cells:
        assert (cell.hparams["layer"], cell.hparams["steering_coeff"], cell.hparams["alpha"],
                cell.hparams["learning_rate"], cell.hparams["effective_batch_size"]) == (7, 6.5, 1200.0, 5e-5, 4)
        assert cell.hparams["adam_eps"] == 1e-6   # WMDP's transformers.AdamW, in the hash
        assert cell.corpora == {"forget_corpus": f"wmdp:{cell.split}-forget[:600]", "retain_corpus": "wmdp:wikitext"}
        assert set(cell.tasks) == {"wmdp_bio", "wmdp_cyber", "wmdp_chem", "mmlu"}
