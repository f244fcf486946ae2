"""`tofu_authors` (benchmarks/tofu/authors.py): a window of TOFU authors as tuning's validation unit. Its rows (the
real files and a fictitious fixture), its refusals as a validation unit, and Forget Quality against its own oracle."""
from __future__ import annotations

import json

import pytest

from cru_harness import plugins
from cru_harness.runner.tuning import validate_with_tuning
from cru_harness.validation import ConfigError

SCHEDULE = {"num_epochs": 2, "effective_batch_size": 8, "micro_batch_size": 8, "warmup_epochs": 0}


def _utils():
    from cru_harness.benchmarks.tofu.tasks import utils

    return utils


def _questions(path) -> list[str]:
    return [json.loads(line)["question"] for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------------------------ rows
@pytest.mark.shared_data
def test_the_window_is_those_authors_rows_on_the_real_files(tofu_dir):
    """authors_3-4: rows 40-79 of `full`, read from `retain_perturbed` (with paraphrased and perturbed answers) for the
    forget task, from `full` for the forget corpus; the retain task holds every other author of retain_perturbed."""
    from cru_harness.benchmarks.tofu.rows import config_rows

    full = _questions(tofu_dir / "full.json")
    window = full[40:80]
    load = _utils().load_tofu_dataset
    forget = load(tofu_config="retain_perturbed", data_dir=str(tofu_dir), tofu_authors="3-4",
                  tofu_authors_set="forget")["train"]
    assert forget["question"] == window
    assert all(len(row["perturbed_answer"]) == 5 and row["paraphrased_answer"] for row in forget)
    retain = load(tofu_config="retain_perturbed", data_dir=str(tofu_dir), tofu_authors="3-4",
                  tofu_authors_set="retain")["train"]
    assert retain["question"] == full[:40] + full[80:400]
    bench = plugins.benchmarks.get("tofu_authors")
    rows, _ = bench.corpus_rows("authors_3-4", tofu_dir)
    assert [row["question"] for row in rows] == window
    assert [full[row] for row in config_rows("authors_3-4")] == window
    assert len(bench.corpus_rows("not_authors_3-4", tofu_dir)[0]) == 3960


def _fixture(tmp_path, n_authors=3) -> str:
    """A fictitious retain_perturbed: n_authors x 20 rows, question `a<author>q<i>`."""
    rows = [{"question": f"a{a}q{i}", "answer": "x", "paraphrased_answer": "y", "perturbed_answer": ["z"],
             "paraphrased_question": "w"} for a in range(1, n_authors + 1) for i in range(20)]
    (tmp_path / "retain_perturbed.json").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "forget10_perturbed.json").write_text("")   # the marker of a TOFU folder
    return str(tmp_path)


def test_the_task_reads_the_metadata_window_and_refuses_a_bad_one(tmp_path):
    load, data = _utils().load_tofu_dataset, _fixture(tmp_path)
    forget = load(tofu_config="retain_perturbed", data_dir=data, tofu_authors="2-3", tofu_authors_set="forget")
    assert forget["train"]["question"] == [f"a{a}q{i}" for a in (2, 3) for i in range(20)]
    retain = load(tofu_config="retain_perturbed", data_dir=data, tofu_authors="2-2", tofu_authors_set="retain")
    assert retain["train"]["question"] == [f"a{a}q{i}" for a in (1, 3) for i in range(20)]
    assert len(load(tofu_config="retain_perturbed", data_dir=data)["train"]) == 60   # tofu_retain: no window
    from cru_harness.errors import InputError

    for window in ("3-4", "2-1", "3", None):   # past the file's authors, reversed, no window
        with pytest.raises(InputError, match="tofu_authors="):
            load(tofu_config="retain_perturbed", data_dir=data, tofu_authors=window, tofu_authors_set="forget")
    with pytest.raises(ValueError, match="tofu_authors_set must be one of"):
        load(tofu_config="retain_perturbed", data_dir=data, tofu_authors="1-1", tofu_authors_set="both")


# ---------------------------------------------------------------------------------------------- as a validation unit
def raw_config(tmp_path, windows=("3-4",), retain_corpus="retain99[:40]", finetune="retain99[:80] + forget01",
               reported=None) -> dict:
    """forget01 reported, a tofu_authors window as the validation unit with its own oracle, GA tuned under FQ."""
    recipe = {"data": finetune, "num_epochs": 1}
    return {"name": "tuned", "output_dir": str(tmp_path / "run"), "seeds": [0], "device": "cpu",
            "models": [{"name": "tiny", "path": "zoo:llama:finetuned", "dtype": "float32", "finetune": recipe}],
            "benchmarks": reported or {"tofu": {"splits": ["forget01"], "limit": 2}},
            "methods": [{"method": "GA", **SCHEDULE}],
            "evaluation": {"batch_size": 8},
            "tuning": {"rule": "forget_quality_at_utility", "grids": {"GA": {"learning_rate": [1.0e-5, 1.0e-4]}},
                       "validation": {"tofu_authors": {"windows": list(windows), "limit": 2,
                                                       "retain_corpus": retain_corpus}},
                       "retain": {f"authors_{w}": {"finetune": {**recipe, "data": "retain99[:40] + forget01"}}
                                  for w in windows}}}


def test_the_validation_window_resolves_to_its_unit_tasks_oracle_and_budget(tmp_path):
    config = validate_with_tuning(raw_config(tmp_path))
    spec = config.tuning
    block = spec.validation.benchmarks["tofu_authors"]
    assert block["splits"] == ["authors_3-4"] and block["forget_corpus"] == "{split}"
    assert spec.budgets["GA"] == "2 settings, 10 + 10 = 20 steps"   # 40 rows of authors 3-4, batch 8, 2 epochs
    bench = plugins.benchmarks.get("tofu_authors")
    assert bench.task_metadata("authors_3-4", None) == {"tofu_authors": "3-4"}
    assert bench.unit_items("authors_3-4", None) == frozenset(("TOFU full", row) for row in range(40, 80))


@pytest.mark.parametrize("windows, message", [
    (["21-22"], "expected authors A-B within 1-20"),
    (["4-3"], "expected authors A-B within 1-20"),
    (["3-4", "3-4"], "repeats a window"),
])
def test_a_window_outside_the_perturbed_authors_is_refused(tmp_path, windows, message):
    with pytest.raises(ConfigError, match=message):
        validate_with_tuning(raw_config(tmp_path, windows=windows))


def test_a_window_sharing_a_row_with_the_reported_split_is_refused(tmp_path):
    # training on forget01 (its retain corpus) shares the reported split's rows
    with pytest.raises(ConfigError, match=r"authors_3-4 trains on \(retain_corpus 'forget01'\) rows 3960-3999"):
        validate_with_tuning(raw_config(tmp_path, retain_corpus="forget01"))
    # a reported window of the same authors: evaluates the same rows
    reported = {"tofu_authors": {"windows": ["4-5"], "limit": 2}}
    with pytest.raises(ConfigError, match=r"authors_3-4 evaluates rows 60-79 of TOFU full"):
        validate_with_tuning(raw_config(tmp_path, reported=reported))


def test_a_fine_tune_that_never_taught_the_window_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="does not teach the validation unit tofu_authors authors_3-4"):
        validate_with_tuning(raw_config(tmp_path, finetune="retain99[:40] + forget01"))


# ------------------------------------------------------------------------------------------ Forget Quality, its oracle
def _cell(kind, ratios, questions):
    return {"kind": kind, "split": "authors_3-4", "hash": kind, "metrics": {},
            "per_item": {"forget_truth_ratio": ratios, "forget_question": questions}}


def test_forget_quality_reads_the_window_task_against_its_own_oracle():
    """`compare_to_oracle` matches the window's items by question (KS test of the truth ratios): a method cell whose
    ratios equal the oracle's scores 1, one far from them scores low."""
    bench = plugins.benchmarks.get("tofu_authors")
    questions = [f"q{i}" for i in range(40)]
    oracle = _cell("retain", [0.3 + 0.01 * i for i in range(40)], questions)
    same, far = _cell("method", list(oracle["per_item"]["forget_truth_ratio"]), questions), \
        _cell("method", [0.001] * 40, questions)
    bench.compare_to_oracle(same, oracle)
    bench.compare_to_oracle(far, oracle)
    assert same["metrics"]["forget_quality"] == pytest.approx(1.0)
    assert far["metrics"]["forget_quality"] < 1e-6
    assert bench.forget_task("authors_3-4") == "tofu_authors"
    assert plugins.benchmarks.get("tofu").forget_task("forget01") == "tofu_forget01"


def test_the_forget_quality_rule_chooses_on_the_windows_scores(tmp_path):
    """Fixed scores for the two settings: the lower learning rate forgets less by ROUGE but is closer to the oracle
    (higher FQ) and keeps utility; the higher one forgets more but drops below 0.9 x the Original's utility."""
    from cru_harness.runner.plan import build_plan
    from cru_harness.runner.tuning import decide

    config = validate_with_tuning(raw_config(tmp_path))
    cells = [c for c in build_plan(config.tuning.validation) if c.kind in ("original", "method", "retain")]
    scores = {"Original": (0.1, 0.50, None), "GA [learning_rate=1e-05]": (0.5, 0.48, 0.40),
              "GA [learning_rate=0.0001]": (0.9, 0.30, 0.90)}

    def load(cell_hash):
        cell = next(c for c in cells if c.hash == cell_hash)
        rouge, utility, fq = scores[cell.label]
        return {"status": "ok", "benchmark": cell.benchmark,
                "metrics": {"forget_rouge_l": rouge, "model_utility": utility, "forget_quality": fq}}

    record = decide(config, cells, load)
    ga = record["methods"]["GA"]
    assert record["rule"] == "forget_quality_at_utility" and record["units"] == ["tofu_authors authors_3-4"]
    assert ga["chosen"] == {"learning_rate": 1.0e-5} and [row["qualifies"] for row in ga["settings"]] == [True, False]
    scores["GA [learning_rate=0.0001]"] = (0.9, 0.46, 0.90)   # now it keeps utility too: the higher FQ wins
    assert decide(config, cells, load)["methods"]["GA"]["chosen"] == {"learning_rate": 1.0e-4}


@pytest.mark.slow
def test_a_tiny_run_tuned_on_a_window_with_its_own_oracle(tmp_path):
    """A tiny model on the fictitious world: GA tuned over two learning rates on author 1's window (its oracle: the
    testbed's small loop on the window's retain corpus), under the Forget Quality rule; every validation cell scored,
    FQ against that oracle included, and the record's FQ is the cells'."""
    import torch

    from conftest import run_config_cells

    torch.set_num_threads(1)
    world = {"data_dir": "testbed:world", "limit": 2}
    config = {"name": "tiny_window", "seeds": [0], "device": "cpu",
              "models": [{"name": "tiny", "path": "zoo:llama:finetuned", "dtype": "float32"}],
              "benchmarks": {"tofu_author": {**world, "authors": [3], "retain_corpus": "author_4"}},
              "methods": [{"method": "GA", "num_epochs": 1, "effective_batch_size": 10, "micro_batch_size": 10,
                           "warmup_epochs": 0}],
              "evaluation": {"batch_size": 8, "max_gen_toks": 12, "failure_classes": False},
              "report": {"formats": ["md"], "plots": False},
              "tuning": {"rule": "forget_quality_at_utility", "grids": {"GA": {"learning_rate": [1.0e-5, 1.0e-2]}},
                         "validation": {"tofu_authors": {**world, "windows": ["1-1"], "retain_corpus": "author_2"}},
                         "retain": {"authors_1-1": {"train": {"epochs": 1}}}}}
    out, results = run_config_cells(tmp_path, config)
    window = [r for r in results if r["benchmark"] == "tofu_authors"]
    assert sorted(r["label"] for r in window) == ["GA [learning_rate=0.01]", "GA [learning_rate=1e-05]", "Original",
                                                  "Retain"]
    methods = [r for r in window if r["kind"] == "method"]
    assert all(r["metrics"]["forget_quality"] is not None and r["metrics"]["model_utility"] is not None
               and r["metrics"]["retain_rouge_l"] is not None for r in methods)
    record = json.loads((out / "tuning" / "tiny.json").read_text())
    assert record["rule"] == "forget_quality_at_utility"
    assert [row["forget_quality"] for row in record["methods"]["GA"]["settings"]] == \
        [r["metrics"]["forget_quality"] for r in sorted(methods, key=lambda r: r["hparams"]["learning_rate"])]
