"""The RWKU and TOFU packages' scorers (`benchmarks/rwku/scoring.py`, `benchmarks/tofu/scoring.py`): a cell's
saved lm-eval samples -> result-schema metrics and failure classes.

The samples below are hand-written fakes in lm-eval's `--log_samples` layout (no model runs); the per-item values
come from the real RWKU `process_results` functions, and the numbers from the real `per_target_results`.
"""
from __future__ import annotations

import json
import math

import pytest

from cru_harness.benchmarks.rwku import scoring as rwku_scoring
from cru_harness.benchmarks.rwku.tasks import utils as rwku
from cru_harness.benchmarks.tofu import scoring as tofu_scoring

DATE = "2025-01-02T03-04-05.678901"


def _doc(i, answer, target=3):
    return {"target": target, "target_name": "Fake Person", "query": f"q{i}", "answer": answer, "type": "x"}


def _fake_probe_sample(i, generation, reference):
    doc = _doc(i, reference)
    values = rwku.process_results_probe(doc, [generation])
    return {"doc_id": i, "doc": doc, "arguments": {"gen_args_0": {"arg_0": f"Question: q{i}\nAnswer:", "arg_1": {}}},
            "filtered_resps": [generation], **values}


def _write(tmp_path, task, rows):
    folder = tmp_path / "lmeval" / "model"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"samples_{task}_{DATE}.jsonl", "w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def test_rwku_cell_metrics_and_failure_classes(tmp_path):
    _write(tmp_path, "rwku_fb", [_fake_probe_sample(0, "Paris", "Paris"), _fake_probe_sample(1, "", "London")])
    _write(tmp_path, "rwku_neighbor_qa", [_fake_probe_sample(0, "I don't know.", "Rome")])
    mmlu_doc = {"target": 3, "target_name": "Fake Person", "answer": 1}
    _write(tmp_path, "rwku_utility_mmlu", [{"doc_id": 0, "doc": mmlu_doc, "arguments": {},
                                            **rwku.process_results_mmlu(mmlu_doc, [(-2.0, False), (-1.0, True),
                                                                                   (-3.0, False), (-4.0, False)])}])
    scored = rwku_scoring.score_rwku_cell(tmp_path / "lmeval", target=3)
    metrics = scored["metrics"]
    assert math.isclose(metrics["forget_fb"], 0.5)          # one exact answer, one empty answer
    assert metrics["utility_mmlu"] == 1.0
    assert metrics["forget_qa"] is None and metrics["mia_auc_loss"] is None  # tasks not run
    forget = scored["failure_classes"]["forget"]
    assert forget["correct"] == 0.5 and forget["degenerate"] == 0.5
    assert scored["failure_classes"]["neighbor"]["refusal"] == 1.0
    assert scored["details"]["per_target"]["rwku_fb"]["3"]["n"] == 2


def test_rwku_cell_without_samples_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no lm-eval samples files"):
        rwku_scoring.score_rwku_cell(tmp_path, target=1)


def test_forget_items_need_questions():
    result = {"hash": "abc", "kind": "retain",
              "per_item": {"forget_truth_ratio": [0.5, 0.7], "forget_question": ["a", "b"]}}
    rows = tofu_scoring.forget_items_from_result(result, "tofu_forget10")
    assert rows == [{"task": "tofu_forget10", "question": "a", "truth_ratio": 0.5, "run": "retain cell abc"},
                    {"task": "tofu_forget10", "question": "b", "truth_ratio": 0.7, "run": "retain cell abc"}]
    assert tofu_scoring.forget_items_from_result({"per_item": {"forget_truth_ratio": [0.5]}}, "tofu_forget10") is None
