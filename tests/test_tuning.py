"""`tuning:` (runner.tuning): the rule on fixed validation scores, the refusals (a validation unit sharing items with
a reported one, a fine-tune that never taught it, unequal budgets), a run that tunes before planning (the report's
Tuning section, the chosen settings in the reported cells' hashes), and the shipped tuned config's dry run."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from cru_harness.runner.cli import run_config
from cru_harness.runner.plan import build_plan
from cru_harness.runner.tuning import (FALLBACK, choose, load_with_tuning, run_tuning, setting_label,
                                       validate_with_tuning)
from cru_harness.validation import ConfigError

REPO = Path(__file__).resolve().parents[1]
LRS = [1.0e-4, 1.0e-3]
SCHEDULE = {"num_epochs": 2, "effective_batch_size": 4, "micro_batch_size": 4, "warmup_epochs": 0}


def raw_config(tmp_path, **tuning) -> dict:
    """forget01 reported, TOFU author 3 as the validation unit, GA and GD tuned over two learning rates."""
    block = {"rule": "forgetting_at_utility", "utility_ratio": 0.9,
             "validation": {"tofu_author": {"authors": [3], "limit": 2, "retain_corpus": "retain99[:40]"}},
             "methods": ["GA", "GD"], "grids": {"GA": {"learning_rate": LRS}, "GD": {"learning_rate": LRS}},
             **tuning}
    return {"name": "tuned", "output_dir": str(tmp_path / "run"), "seeds": [0, 1], "device": "cpu",
            "models": [{"name": "tiny", "path": "zoo:llama:finetuned", "dtype": "float32"}],
            "benchmarks": {"tofu": {"splits": ["forget01"], "limit": 2, "tasks": ["tofu_{split}", "tofu_retain"]}},
            "methods": [{"method": "GA", **SCHEDULE, "learning_rate": 1.0e-5},
                        {"method": "GD", **SCHEDULE}, {"method": "NPO", **SCHEDULE}],
            "evaluation": {"batch_size": 8, "failure_classes": False},
            "report": {"formats": ["md"], "plots": False, "stats": False}, "tuning": block}


# ------------------------------------------------------------------------------------------------ the rule itself
def rows(*pairs, fq=None):
    return [{"forgetting": f, "utility": u, "forget_quality": None if fq is None else fq[i]}
            for i, (f, u) in enumerate(pairs)]


def test_the_rule_picks_the_most_forgetting_setting_that_keeps_utility():
    # the Original's utility 0.5, r 0.9: the floor is 0.45
    scores = rows((0.95, 0.10), (0.60, 0.46), (0.70, 0.50), (0.80, 0.44))
    index, reason = choose(scores, 0.5, "forgetting_at_utility", 0.9)
    assert index == 2 and reason.startswith("2 of 4 settings keep utility >= 0.9 x 0.5")
    assert choose(scores, 0.5, "forgetting_at_utility", 0.8)[0] == 3   # 0.44 >= 0.40: the most forgetting kept


def test_ties_go_to_the_earlier_setting_and_failed_settings_are_never_chosen():
    assert choose(rows((0.7, 0.5), (0.7, 0.6)), 0.5, "forgetting_at_utility", 0.9)[0] == 0
    assert choose(rows((None, None), (0.1, 0.5)), 0.5, "forgetting_at_utility", 0.9)[0] == 1


def test_without_a_qualifying_setting_the_rule_keeps_the_most_utility():
    index, reason = choose(rows((0.9, 0.1), (0.5, 0.3), (0.8, 0.2)), 0.5, "forgetting_at_utility", 0.9)
    assert (index, reason) == (1, FALLBACK)


def test_the_forget_quality_rule_reads_forget_quality_not_forgetting():
    scores = rows((0.9, 0.5), (0.1, 0.5), fq=[0.01, 0.6])
    assert choose(scores, 0.5, "forget_quality_at_utility", 0.9)[0] == 1
    assert choose(scores, 0.5, "forgetting_at_utility", 0.9)[0] == 0


# ------------------------------------------------------------------------------------------------ config refusals
def test_a_tuned_config_resolves_its_grids_and_validation_cells(tmp_path):
    config = validate_with_tuning(raw_config(tmp_path))
    spec = config.tuning
    assert spec.settings == {"GA": [{"learning_rate": lr} for lr in LRS], "GD": [{"learning_rate": lr} for lr in LRS]}
    assert spec.budgets == {"GA": "2 settings, 10 + 10 = 20 steps", "GD": "2 settings, 10 + 10 = 20 steps"}
    cells = [c for c in build_plan(spec.validation) if c.kind == "method"]
    assert {c.label for c in cells} == {setting_label(m, {"learning_rate": lr}) for m in ("GA", "GD") for lr in LRS}
    assert {(c.benchmark, c.unit, c.seed) for c in cells} == {("tofu_author", "author_3", 0)}   # the run's first seed
    ga = next(c for c in cells if c.label == "GA [learning_rate=0.001]")
    assert ga.hparams["learning_rate"] == 1.0e-3 and ga.corpora["retain_corpus"] == "retain99[:40]"


def test_a_config_without_tuning_plans_the_same_cells_as_before(tmp_path):
    """No committed hash moves: the committed forget01 run's plan is what its config plans today."""
    config = load_with_tuning(REPO / "configs" / "cpu_smollm2_forget01.yaml")
    assert config.tuning is None
    committed = json.loads((REPO / "results" / "cpu_smollm2_forget01" / "plan.json").read_text())
    assert [c.hash for c in build_plan(config)] == [c["hash"] for c in committed["cells"]]


@pytest.mark.parametrize("validation, message", [
    ({"tofu_author": {"authors": [200], "retain_corpus": "retain99[:40]"}},
     "tuning.validation.tofu_author: tofu_author author_200 evaluates rows 3980-3999 of TOFU full, which the reported "
     "tofu forget01 evaluates: a validation unit must share no item with a reported one"),
    ({"tofu_author": {"authors": [3]}},   # its default retain corpus, every other author, holds forget01
     "tofu_author author_3 trains on (retain_corpus 'not_author_3') rows 3960-3999 of TOFU full"),
    ({"tofu": {"splits": ["forget05"]}}, "tofu forget05 evaluates rows 3960-3999 of TOFU full"),
])
def test_a_validation_unit_sharing_an_item_with_a_reported_one_is_refused(tmp_path, validation, message):
    with pytest.raises(ConfigError) as err:
        validate_with_tuning(raw_config(tmp_path, validation=validation))
    assert str(err.value).startswith("tuning.validation.") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_validation_cells_start_from_the_runs_own_fine_tune(tmp_path):
    """The validation plan's own fine-tune cell is not run (the run's replaces it: one model), so every validation
    cell reads the run's: its oracle and Original start from it, as the reported cells do."""
    from cru_harness.runner.execute import PlanExecutor
    from cru_harness.runner.tuning import validation_cells

    raw = raw_config(tmp_path)
    raw["models"][0]["finetune"] = {"data": "retain99[:80] + forget01"}
    config = validate_with_tuning(raw)
    (finetune,) = [c for c in build_plan(config) if c.kind == "finetune"]
    cells = validation_cells(config, [finetune])
    assert cells[0].hash == finetune.hash and len(cells) > 2
    assert all(c.decisions.starts_from == finetune.hash for c in cells[1:])
    assert [c.hash for c in cells[1:]] == [c.hash for c in build_plan(config.tuning.validation) if c.kind != "finetune"]
    original = next(c for c in cells if c.kind == "original")
    assert PlanExecutor(None, cells).read(original.decisions.starts_from).kind == "finetune"


def test_a_fine_tune_that_never_taught_the_validation_authors_is_refused(tmp_path):
    raw = raw_config(tmp_path)
    raw["models"][0]["finetune"] = {"data": "retain99[:40] + forget01"}
    with pytest.raises(ConfigError, match=r"^models\[0\]\.finetune\.data: 'retain99\[:40\] \+ forget01' does not "
                                          r"teach the validation unit tofu_author author_3 \(20 of its 20 items\)"):
        validate_with_tuning(raw)
    raw["models"][0]["finetune"] = {"data": "retain99[:80] + forget01"}   # authors 1-4 and forget01's
    assert validate_with_tuning(raw).tuning is not None


def test_grids_that_give_methods_unequal_budgets_are_refused(tmp_path):
    raw = raw_config(tmp_path, grids={"GA": {"learning_rate": LRS}, "GD": {"learning_rate": [*LRS, 3.0e-3]}})
    with pytest.raises(ConfigError, match=r"^tuning\.grids: unequal budgets on tofu_author author_3 \(grid size x "
                                          r"steps\): GA 2 settings, 10 \+ 10 = 20 steps; GD 3 settings, "
                                          r"10 \+ 10 \+ 10 = 30 steps"):
        validate_with_tuning(raw)
    # the same budget spent differently (fewer settings, more steps each) is equal
    raw = raw_config(tmp_path, grids={"GA": {"learning_rate": LRS}, "GD": {"learning_rate": [1.0e-4],
                                                                          "num_epochs": [4]}})
    assert validate_with_tuning(raw).tuning.budgets["GD"] == "1 settings, 20 = 20 steps"


@pytest.mark.parametrize("tuning, key, message", [
    ({"rule": "best_on_test"}, "tuning.rule", "unknown rule 'best_on_test'; one of: forgetting_at_utility, "
                                              "forget_quality_at_utility"),
    ({"rule": "forget_quality_at_utility"}, "tuning.rule", "forget_quality_at_utility reads Forget Quality against "
                                                           "the validation unit's oracle"),
    ({"methods": ["GA", "WGA"]}, "tuning.methods[1]", "'WGA' is no method label of this config"),
    ({"grids": {"NPO": {"learning_rate": LRS}}}, "tuning.grids.NPO", "is not a tuned label"),
    ({"methods": None}, "tuning.grids", "unequal budgets"),   # NPO's default grid: 4 settings
    ({"grids": {"GA": {"learning_rate": []}, "GD": {"learning_rate": LRS}}}, "tuning.grids.GA.learning_rate",
     "expected a non-empty list of values"),
    ({"grids": {"GA": {"beta": [0.1]}, "GD": {"learning_rate": LRS}}}, "tuning.grids.GA.beta",
     "not a hyperparameter of GA"),
    ({"overrides": {"lam": 2}}, "tuning.overrides.lam", "no tuned method accepts it"),
    ({"rules": "x"}, "tuning.rules", "unknown key"),
])
def test_a_bad_tuning_block_is_one_line_naming_its_key(tmp_path, tuning, key, message):
    with pytest.raises(ConfigError) as err:
        validate_with_tuning(raw_config(tmp_path, **tuning))
    assert str(err.value).startswith(f"{key}: ") and message in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------------ a tuned run
def fake_executor(ran):
    """Forgetting grows with the learning rate; GD's utility collapses at 1e-3, so the rule keeps GA at 1e-3 and GD
    at 1e-4."""
    def executor(cell, workdir):
        ran.append(cell)
        lr = cell.hparams.get("learning_rate", 0.0)
        if cell.benchmark == "tofu_author":
            utility = 0.2 if (cell.method == "GD" and lr >= 1.0e-3) else 0.8
            return {"metrics": {"forget_rouge1": 1 - 500 * lr, "retain_rouge1": utility}}
        return {"metrics": {"forget_rouge_l": 0.5, "model_utility": 0.4}}
    return executor


def test_a_tuned_run_chooses_first_runs_the_choice_and_reports_how(tmp_path):
    config = validate_with_tuning(raw_config(tmp_path))
    ran: list = []
    assert run_config(config, executor=fake_executor(ran), log=lambda _: None) == 0
    validation = [c for c in ran if c.benchmark == "tofu_author"]
    assert len(validation) == 5 and ran[:5] == validation   # 2 x 2 settings and the Original, before the rest
    reported = {(c.label, c.seed): c for c in ran if c.benchmark == "tofu" and c.kind == "method"}
    assert {key[0] for key in reported} == {"GA", "GD", "NPO"}
    assert reported["GA", 0].hparams["learning_rate"] == 1.0e-3 and reported["GD", 1].hparams["learning_rate"] == 1.0e-4
    tuning = reported["GA", 0].extra["tuning"]
    assert tuning["rule"] == "forgetting_at_utility" and tuning["chosen"] == {"learning_rate": 1.0e-3}
    assert set(tuning["validation_cells"]) <= {c.hash for c in validation} and len(tuning["validation_cells"]) == 3
    assert "tuning" not in reported["NPO", 0].extra   # untuned entries plan as they would without the block
    assert reported["NPO", 0].hash == next(c for c in build_plan(validate_with_tuning(
        {k: v for k, v in raw_config(tmp_path).items() if k != "tuning"})) if c.label == "NPO").hash
    record = json.loads((config.output_dir / "tuning" / "tiny.json").read_text())
    assert record["methods"]["GD"]["chosen"] == {"learning_rate": 1.0e-4}
    assert [row["qualifies"] for row in record["methods"]["GD"]["settings"]] == [True, False]
    report = (config.output_dir / "report" / "report.md").read_text()
    assert "## Tuning (tiny)" in report and "`forgetting_at_utility`" in report
    assert "| GD | learning_rate=0.001 | 0.5000 | 0.2000 | — | no |" in report
    assert "| GA | learning_rate=0.001 | 0.5000 | 0.8000 | — | yes |" in report and "**chosen**" in report
    assert "TOFU_AUTHOR" not in report and "have no result" not in report   # validation cells stay out of tables
    plan = json.loads((config.output_dir / "plan.json").read_text())
    assert {c.hash for c in validation} <= {c["hash"] for c in plan["cells"]}
    # a second run reuses every cell and makes the same choice
    again: list = []
    assert run_config(validate_with_tuning(raw_config(tmp_path)), executor=fake_executor(again), log=lambda _: None) == 0
    assert again == []


def test_a_dry_run_lists_the_validation_cells_and_what_waits_for_the_choice(tmp_path, capsys):
    config = validate_with_tuning(raw_config(tmp_path))
    assert run_config(config, dry_run=True, log=lambda _: None) == 0
    out = capsys.readouterr().out
    assert "tuning: forgetting_at_utility, 5 validation cells first" in out
    assert "planned once the rule has chosen: GA, GD" in out and "GA [learning_rate=0.001] seed=0" in out
    assert not (tmp_path / "run").exists()


def test_the_shipped_tuned_config_plans_its_validation_before_anything_runs(tmp_path, monkeypatch, capsys):
    """configs/cpu_smollm2_forget01_tuned.yaml: forget01 reported at seeds 0-2, TOFU authors 3-4 as validation with
    their own oracle (the fine-tune without them) under the Forget Quality rule, every default grid at the same budget,
    the Original taught the validation authors."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "lunar").mkdir(parents=True)
    (tmp_path / "data" / "lunar" / "harmful.json").write_text('["a harmful prompt"]')   # LUNAR's file, user-supplied
    config = load_with_tuning(REPO / "configs" / "cpu_smollm2_forget01_tuned.yaml")
    base = load_with_tuning(REPO / "configs" / "cpu_smollm2_forget01.yaml")
    assert config.seeds == (0, 1, 2) and config.benchmarks["tofu"]["splits"] == ["forget01"]
    assert config.models[0].finetune["data"] == "retain99[:80] + forget01"
    spec = config.tuning
    assert spec.rule == "forget_quality_at_utility"
    assert spec.validation.benchmarks["tofu_authors"]["splits"] == ["authors_3-4"]
    oracle = spec.validation.models[0].retain["authors_3-4"]
    assert (oracle.kind, oracle.value["data"]) == ("finetune", "retain99[:40] + forget01")
    assert set(spec.settings) == {m.label for m in base.methods} - {"LUNAR"}
    assert all(budget.startswith("4 settings, ") and budget.endswith(" = 40 steps") for budget in spec.budgets.values())
    assert spec.budgets["GA"] == "4 settings, 10 + 10 + 10 + 10 = 40 steps"   # forget01's 10 steps per setting
    assert spec.budgets["CRU"] == "4 settings, 5 + 15 + 5 + 15 = 40 steps"   # 1 and 3 epochs of 5 router steps
    assert config.evaluation["logit_lens"] and "logit_lens" not in spec.validation.evaluation   # no rule reads it
    _, cells, record = run_tuning(config, dry_run=True)
    assert record is None
    assert sum(c.kind == "method" for c in cells) == 17 * 4
    assert sum(c.kind == "original" for c in cells) == 1 and sum(c.kind == "retain" for c in cells) == 1
    assert {c.unit for c in cells} == {"authors_3-4"}
    assert all(c.tasks[:2] == ("tofu_authors", "tofu_authors_retain") for c in cells)
    assert run_config(config, dry_run=True, as_json=True, log=lambda _: None) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["tuning"]["validation_cells"] == 70 and len(summary["tuning"]["pending"]) == 17
    # the untuned base keeps its shape: same methods, same evaluation
    assert [m.label for m in config.methods] == [m.label for m in base.methods]
    assert config.evaluation == base.evaluation and copy.deepcopy(config.benchmarks) == base.benchmarks


@pytest.mark.slow
def test_a_tiny_tuned_run_end_to_end(tmp_path):
    """A tiny model on the fictitious world: GA tuned over two learning rates on author 2, reported on author 1,
    and relearned (the tuned cell and the Original, its control), as the tuned robustness run is computed."""
    import torch

    from conftest import run_config_cells

    torch.set_num_threads(1)
    config = {"name": "tiny_tuned", "seeds": [0], "device": "cpu",
              "models": [{"name": "tiny", "path": "zoo:llama:finetuned", "dtype": "float32"}],
              "benchmarks": {"tofu_author": {"data_dir": "testbed:world", "authors": [1], "limit": 2,
                                             "retain_corpus": "author_3"}},
              "methods": [{"method": "GA", "num_epochs": 1, "effective_batch_size": 10, "micro_batch_size": 10,
                           "warmup_epochs": 0}],
              "evaluation": {"batch_size": 8, "max_gen_toks": 12, "failure_classes": False},
              "report": {"formats": ["md"], "plots": False},
              "attacks": [{"attack": "relearn", "learning_rate": 1.0e-3}],
              "tuning": {"rule": "forgetting_at_utility", "grids": {"GA": {"learning_rate": [1.0e-5, 1.0e-2]}},
                         "validation": {"tofu_author": {"data_dir": "testbed:world", "authors": [2], "limit": 2,
                                                        "retain_corpus": "author_3"}}}}
    out, results = run_config_cells(tmp_path, config)
    assert sorted((r["unit"], r["label"]) for r in results) == [
        ("author_1", "GA"), ("author_1", "GA + relearn"), ("author_1", "Original"), ("author_1", "Original + relearn"),
        ("author_2", "GA [learning_rate=0.01]"), ("author_2", "GA [learning_rate=1e-05]"), ("author_2", "Original")]
    record = json.loads((out / "tuning" / "tiny.json").read_text())
    chosen = record["methods"]["GA"]["chosen"]
    reported = next(r for r in results if r["label"] == "GA")
    assert reported["hparams"]["learning_rate"] == chosen["learning_rate"]
    cell_record = json.loads((out / "cells" / reported["hash"] / "run_record.json").read_text())
    assert cell_record["resolved_config"]["extra"]["tuning"]["chosen"] == chosen
    attacked = next(r for r in results if r["label"] == "GA + relearn")
    assert attacked["details"]["attack"]["attacked"] == reported["hash"]   # the tuned cell, not a validation one
    report = (out / "report" / "report.md").read_text()
    assert "## Tuning (tiny)" in report and "| tiny | author_2 |" not in report
    assert "| tiny | author_1 | GA | relearn | held-out (1) |" in report   # the robustness table reads the tuned cell


@pytest.mark.shared_data
def test_the_row_map_is_tofus_own_layout(tofu_dir):
    """`benchmarks.tofu.rows` says which rows of `full` each config holds without reading the data: the real files."""
    from cru_harness.benchmarks.tofu.rows import config_rows, source_rows

    def questions(name):
        return [json.loads(line)["question"] for line in (tofu_dir / f"{name}.json").read_text().splitlines()
                if line.strip()]

    full = questions("full")
    for name in ("forget01", "forget05", "forget10", "retain90", "retain95", "retain99", "retain_perturbed",
                 "forget01_perturbed"):
        assert [full[row] for row in config_rows(name)] == questions(name), name
    assert config_rows("author_3") == list(range(40, 60)) and len(config_rows("not_author_3")) == 3980
    assert source_rows("retain99[:80] + forget01") == [*range(80), *range(3960, 4000)]
    assert source_rows("holdout01") is None and config_rows("real_authors") is None


def test_a_failed_validation_cell_is_never_chosen_and_fails_the_run(tmp_path):
    config = validate_with_tuning(raw_config(tmp_path))
    ran: list = []
    inner = fake_executor(ran)

    def executor(cell, workdir):
        if cell.label == "GA [learning_rate=0.001]":
            raise RuntimeError("diverged")
        return inner(cell, workdir)

    assert run_config(config, executor=executor, log=lambda _: None) == 1
    record = json.loads((config.output_dir / "tuning" / "tiny.json").read_text())
    assert record["methods"]["GA"]["chosen"] == {"learning_rate": 1.0e-4}
    assert record["methods"]["GA"]["settings"][1]["cells"][0]["status"] == "failed"


def test_a_tuned_run_takes_no_shard(tmp_path):
    from cru_harness.errors import InputError

    with pytest.raises(InputError, match=r"^a config with `tuning:` runs its validation cells before planning the "
                                         r"rest"):
        run_config(validate_with_tuning(raw_config(tmp_path)), dry_run=True, shard="1/2", log=lambda _: None)


def test_a_reported_unit_of_another_dataset_shares_nothing_and_one_without_declared_items_is_refused(tmp_path):
    raw = raw_config(tmp_path)
    raw["benchmarks"]["rwku"] = {"targets": [1], "limit": 2}   # RWKU's real people: no TOFU author among them
    for method in raw["methods"]:
        method["benchmarks"] = ["tofu"]
    assert validate_with_tuning(raw).tuning is not None
    raw = raw_config(tmp_path, validation={"rwku": {"targets": [1], "limit": 2}})
    raw["benchmarks"] = {"rwku": {"targets": [1, 2], "limit": 2}}
    with pytest.raises(ConfigError, match=r"^tuning\.validation\.rwku: rwku target1 is a reported unit$"):
        validate_with_tuning(raw)


def test_a_config_read_without_its_tuning_leaves_the_block_as_written_and_is_not_run(tmp_path):
    """`runner.config.validate_config` sits below the planning the tuning checks need: it leaves `tuning:` as
    written, and running such a config is a bug (a traceback), never a run that silently skips the tuning."""
    from cru_harness.runner.config import validate_config

    raw = raw_config(tmp_path)
    config = validate_config(raw)
    assert config.tuning == raw["tuning"]
    with pytest.raises(TypeError, match="was not resolved"):
        run_config(config, dry_run=True, log=lambda _: None)
    assert validate_with_tuning(raw).tuning.rule == "forgetting_at_utility"


def test_the_report_names_validation_cells_from_a_fine_tuning_re_run_with_other_weights(tmp_path):
    """A campaign's new machine fine-tunes again, and another CPU's rounding gives other weights: the Tuning section
    (and, before the rule chose, the list of validation cells) says how many validation cells started from such a
    checkpoint, as the leaderboards say it of reported cells; with none, it says nothing."""
    import shutil

    from cru_harness.reporting.cli import read_plans
    from cru_harness.reporting.tuning import pending_tuning, tuning_markdown
    from cru_harness.store import load_results

    config = validate_with_tuning(raw_config(tmp_path))
    assert run_config(config, executor=fake_executor([]), report=False, log=lambda _: None) == 0
    out = config.output_dir
    loaded = load_results(out)
    validation = [r for r in loaded if r["benchmark"] == "tofu_author"]
    assert tuning_markdown([out], loaded) == tuning_markdown([out])   # every cell from the recorded checkpoint
    refit = {"finetuned_from": {"cell": "f", "matches_recorded": False}}
    loaded = [dict(r, details=refit) if r["hash"] in {v["hash"] for v in validation[:2]} else r for r in loaded]
    note = "- Validation: 2 cell(s) from a fine-tuning re-run whose weights differ from the recorded checkpoint's."
    assert note in tuning_markdown([out], loaded) and note not in tuning_markdown([out])
    shutil.rmtree(out / "tuning")   # as landed before the rule chose
    lines, _ = pending_tuning([out], read_plans([out]), loaded)
    assert note in lines and note not in pending_tuning([out], read_plans([out]), load_results(out))[0]
