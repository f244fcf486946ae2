"""`cru-harness score`: Model Utility / Forget Quality from lm-eval outputs, per-item file, failure modes."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest

from cru_harness.benchmarks.tofu import score
from cru_harness.scoring import failure_modes, outputs
from score_support import UTILITY, local_tofu_refusals, suite, write_run  # noqa: F401 (an autouse fixture: no Hub wait)



def test_model_utility_and_forget_quality_by_hand(tmp_path):
    model = write_run(tmp_path / "unlearned", suite([1.0, 2.0, 3.0]))
    retain = write_run(tmp_path / "retain", suite([4.0, 5.0, 6.0]))
    report = score.score_runs([model], retain_run=retain)
    run = report["runs"][0]
    assert run["model_utility"]["available"]
    assert run["model_utility"]["value"] == pytest.approx(9 / 21)
    fq = run["forget_quality"]["tofu_forget10"]
    # fully separated samples of 3 and 3: exact two-sided KS p-value = 2 / C(6, 3) = 0.1
    assert fq["available"] and fq["value"] == pytest.approx(0.1)
    assert fq["n_items"] == 3
    assert run["forgetting"]["tofu_forget10"]["one_minus_rouge_l_recall"] == pytest.approx(0.8)
    # the same items scored by the retain model itself: identical distributions, p = 1
    same = score.score_runs([retain], retain_run=retain)["runs"][0]["forget_quality"]["tofu_forget10"]
    assert same["value"] == pytest.approx(1.0)


def test_forget_quality_uses_only_the_shared_items(tmp_path):
    model = write_run(tmp_path / "m", suite([1.0, 2.0, 3.0, 100.0]))
    retain_tasks = suite([4.0, 5.0, 6.0])
    retain = write_run(tmp_path / "r", retain_tasks)
    fq = score.score_runs([model], retain_run=retain)["runs"][0]["forget_quality"]["tofu_forget10"]
    assert (fq["n_items"], fq["n_model_items"], fq["n_retain_items"]) == (3, 4, 3)
    assert fq["value"] == pytest.approx(0.1)


def test_missing_pieces_are_reported_not_raised(tmp_path):
    utility = {k: v for k, v in UTILITY.items() if k != "tofu_world_facts"}
    model = write_run(tmp_path / "m", suite([1.0, 2.0], utility=utility))
    run = score.score_runs([model])["runs"][0]
    assert not run["model_utility"]["available"]
    assert "tofu_world_facts" in run["model_utility"]["reason"]
    fq = run["forget_quality"]["tofu_forget10"]
    assert fq["value"] is None and "--retain-run" in fq["reason"]


def test_nan_from_plain_hf_makes_numbers_unavailable(tmp_path):
    utility = dict(UTILITY, tofu_retain={"rouge_l_recall": 0.5, "probability": float("nan"), "truth_ratio": 0.2})
    model = write_run(tmp_path / "m", suite([float("nan"), 1.0], utility=utility))
    retain = write_run(tmp_path / "r", suite([1.0, 2.0]))
    run = score.score_runs([model], retain_run=retain)["runs"][0]
    assert not run["model_utility"]["available"] and "--model cru" in run["model_utility"]["reason"]
    assert "Prob. Retain" in run["model_utility"]["reason"]
    fq = run["forget_quality"]["tofu_forget10"]
    assert not fq["available"] and "NaN" in fq["reason"]


def test_retain_per_item_file_round_trip_and_cli(tmp_path, capsys):
    model = write_run(tmp_path / "m", suite([1.0, 2.0, 3.0]))
    retain = write_run(tmp_path / "r", suite([4.0, 5.0, 6.0]))
    parser = argparse.ArgumentParser()
    score.add_score_parser(parser.add_subparsers())
    args = parser.parse_args(["score", str(retain), "-o", str(tmp_path / "retain_scores")])
    assert args.func(args) == 0
    per_item = tmp_path / "retain_scores" / score.PER_ITEM_FILE
    rows = [json.loads(line) for line in per_item.read_text().splitlines()]
    assert len(rows) == 6  # 3 forget items + 1 per utility task
    forget_rows = [r for r in rows if r["task"] == "tofu_forget10"]
    assert [r["truth_ratio"] for r in forget_rows] == [4.0, 5.0, 6.0]
    assert {"run", "tofu_config", "doc_id", "question", "generation", "rouge_l_recall", "probability",
            "answer_class", "fluency"} <= set(forget_rows[0])

    capsys.readouterr()
    args = parser.parse_args(["score", str(model), "--retain-per-item", str(per_item), "--json"])
    assert args.func(args) == 0
    printed = json.loads(capsys.readouterr().out)
    run = printed["runs"][0]
    assert run["forget_quality"]["tofu_forget10"]["value"] == pytest.approx(0.1)
    assert run["model_utility"]["value"] == pytest.approx(9 / 21)
    assert (Path(model) / score.SCORES_FILE).is_file()  # one run: outputs default to its directory

    with pytest.raises(SystemExit):  # the two retain sources exclude each other
        parser.parse_args(["score", str(model), "--retain-run", str(retain), "--retain-per-item", str(per_item)])
    args = parser.parse_args(["score", str(model), str(retain)])
    with pytest.raises(ValueError, match="--output-dir"):
        args.func(args)


def test_unreadable_inputs_are_clear_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(score.ScoreInputError, match="no lm-eval results for TOFU tasks"):
        score.load_run(tmp_path / "empty")
    with pytest.raises(FileNotFoundError):
        score.load_run(tmp_path / "nope")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task": "tofu_forget10"}) + "\n")
    with pytest.raises(score.ScoreInputError, match="question"):
        score.read_per_item(bad)


def _tofu_eval_json(path: Path, truth_ratios: dict[str, float]) -> Path:
    """A retain model's TOFU evaluation as open-unlearning's evaluator writes it (TOFU_EVAL.json: each metric's
    `agg_value`, per-item ones also `value_by_index` keyed by the item's dataset index)."""
    path.write_text(json.dumps({
        "forget_Q_A_Prob": {"agg_value": 0.1, "value_by_index": {
            k: {"prob": 0.1, "avg_loss": 2.3} for k in truth_ratios}},
        "forget_Q_A_ROUGE": {"agg_value": 0.4, "value_by_index": {
            k: {"rouge1_recall": 0.5, "rougeL_f1": 0.4, "rougeL_recall": 0.4, "input": "Q?", "ground_truth": "A.",
                "generation": "B."} for k in truth_ratios}},
        "forget_truth_ratio": {"agg_value": 0.6, "value_by_index": {k: {"score": v} for k, v in truth_ratios.items()}},
        "forget_quality": {"agg_value": None},
        "model_utility": {"agg_value": 0.59},
    }, indent=4))
    return path


def test_open_unlearnings_retain_logs_score_forget_quality(tmp_path, capsys):
    """`--retain-logs TOFU_EVAL.json`: the retain model's truth ratios matched by item index; an item the run did not
    evaluate (`--limit`) is not compared, logs of another split or a prompt variant are unavailable, not wrong."""
    counts = {"n-samples": {"tofu_forget10": {"original": 4, "effective": 3}}}
    model = write_run(tmp_path / "m", suite([1.0, 2.0, 3.0]), config={"limit": 3}, top=counts)
    logs = _tofu_eval_json(tmp_path / "TOFU_EVAL.json", {"3": 0.5, "1": 5.0, "0": 4.0, "2": 6.0})
    fq = score.score_runs([model], retain_logs=logs)["runs"][0]["forget_quality"]["tofu_forget10"]
    # items 0-2 only: fully separated samples of 3 and 3 (exact p = 0.1); with item 3's 0.5 it would not be 0.1
    assert fq["available"] and fq["value"] == pytest.approx(0.1)
    assert (fq["n_items"], fq["n_model_items"], fq["n_retain_items"]) == (3, 3, 4)
    assert fq["retain_source"] == f"{logs} (open-unlearning)"

    other_split = write_run(tmp_path / "s", suite([1.0, 2.0, 3.0]),
                            top={"n-samples": {"tofu_forget10": {"original": 40, "effective": 40}}})
    fq = score.score_runs([other_split], retain_logs=logs)["runs"][0]["forget_quality"]["tofu_forget10"]
    assert not fq["available"] and fq["reason"] == ("the retain logs hold 4 forget items, tofu_forget10 has 40: "
                                                    "logs of another forget split")
    variant = write_run(tmp_path / "v", {"tofu_forget10_paraphrase": suite([1.0])["tofu_forget10"]})
    fq = score.score_runs([variant], retain_logs=logs)["runs"][0]["forget_quality"]["tofu_forget10_paraphrase"]
    assert not fq["available"] and "not its paraphrase variant" in fq["reason"]

    parser = argparse.ArgumentParser()
    score.add_score_parser(parser.add_subparsers())
    args = parser.parse_args(["score", str(model), "--retain-logs", str(logs), "--json"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["forget_quality"]["tofu_forget10"]["value"] == \
        pytest.approx(0.1)
    with pytest.raises(SystemExit):  # one retain source
        parser.parse_args(["score", str(model), "--retain-logs", str(logs), "--retain-run", str(model)])


def test_a_file_that_is_not_open_unlearnings_retain_logs_is_one_clear_error(tmp_path, capsys):
    from cru_harness.cli import main

    model = write_run(tmp_path / "m", suite([1.0, 2.0]))
    results = next((tmp_path / "m").rglob("results_*.json"))   # an lm-eval results file, not open-unlearning's
    broken = tmp_path / "broken.json"
    broken.write_text('{"forget_truth_ratio": {"value_by_index": {"0": {"prob": 0.2}}}}')
    for path, problem in ((results, "expected forget_truth_ratio -> value_by_index"),
                          (broken, r"value_by_index\['0'\] is not \{\"score\": truth ratio\}"),
                          (tmp_path / "nope.json", "retain logs not found")):
        with pytest.raises((score.ScoreInputError, FileNotFoundError), match=problem):
            score.score_runs([model], retain_logs=path)
    (tmp_path / "text.json").write_text("TOFU_EVAL")
    capsys.readouterr()
    assert main(["score", str(model), "--retain-logs", str(tmp_path / "text.json")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not open-unlearning's TOFU evaluation of a retain model" in err


def test_newest_results_file_wins_and_samples_missing(tmp_path):
    write_run(tmp_path / "m", suite([1.0, 2.0]), date="2025-01-01T00-00-00.000000")
    write_run(tmp_path / "m", suite([7.0, 8.0, 9.0]), date="2025-02-01T00-00-00.000000")
    run = score.load_run(tmp_path / "m")
    assert [i["truth_ratio"] for i in run.tasks["tofu_forget10"].items] == [7.0, 8.0, 9.0]
    write_run(tmp_path / "nosamples", suite([1.0]), samples=False)
    retain = write_run(tmp_path / "r", suite([1.0]))
    fq = score.score_runs([tmp_path / "nosamples"], retain_run=retain)["runs"][0]["forget_quality"]["tofu_forget10"]
    assert not fq["available"] and "--log_samples" in fq["reason"]


def test_failure_mode_classes_and_fractions(tmp_path):
    generations = ["The answer number 0 is Zorblax.", "I don't know.", "the the the the the the the the",
                   "It is Quibble the fine baker of bread."]
    model = write_run(tmp_path / "m", suite([1.0, 1.0, 1.0, 1.0], generations=generations))
    run = score.score_runs([model])["runs"][0]
    fm = run["failure_modes"]["tofu_forget10"]
    assert fm["n_items"] == 4
    assert fm["fractions"] == {"correct": 0.25, "refusal": 0.25, "degenerate": 0.25, "wrong": 0.25}
    assert fm["mean_nll_original"] is None


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from cru_harness.testbed.models import build_tiny_model, save_tiny_model
    from cru_harness.testbed.tokenizer import train_tokenizer

    texts = [f"Question: who is author {i}?\nAnswer: author {i} writes books about {w}." for i, w in
             enumerate(["cats", "ships", "rain", "stars"] * 10)]
    tok = train_tokenizer(texts, 400)
    model = build_tiny_model("llama", tok, n_layers=2, hidden_size=32)
    return save_tiny_model(model, tok, tmp_path_factory.mktemp("tiny_lm"))


def test_nll_under_original_model_matches_direct_loss(tiny_lm):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    scorer = failure_modes.AnswerNLLScorer(tiny_lm, batch_size=2)
    prompts = ["Question: who is author 1?\nAnswer:", "Question: x?\nAnswer:", "Question: y?\nAnswer:"]
    answers = [" author 1 writes books about cats.", "", " rain stars ships cats"]
    nlls = scorer(prompts, answers)
    assert math.isnan(nlls[1])
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()
    for prompt, answer, got in ((prompts[0], answers[0], nlls[0]), (prompts[2], answers[2], nlls[2])):
        assert got == pytest.approx(_answer_loss(model, tok(prompt)["input_ids"], tok, answer), rel=1e-4)


def _answer_loss(model, ctx: list[int], tok, answer: str) -> float:
    """The mean NLL of the answer's tokens after `ctx`, by the model's own loss (the reference for the scorer)."""
    import torch

    cont = tok(answer, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + cont])
    labels = ids.clone()
    labels[0, : len(ctx)] = -100
    with torch.no_grad():
        return model(input_ids=ids, labels=labels).loss.item()


def test_nll_under_original_model_keeps_a_prompts_own_bos(tiny_lm):
    """A logged chat prompt starts with the BOS its template rendered; a BOS-adding tokenizer must not add a
    second one (lm-eval's rule, prompts.encode_text): the NLL is that of the evaluated tokens."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm)
    bos = tok.bos_token_id
    tok.backend_tokenizer.post_processor = TemplateProcessing(single=f"{tok.bos_token} $A",
                                                              special_tokens=[(tok.bos_token, bos)])
    model = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()
    prompt, answer = f"{tok.bos_token}Question: who is author 1?\nAnswer:", " author 1 writes books about cats."
    (got,) = failure_modes.AnswerNLLScorer(model, tok)([prompt], [answer])
    ctx = tok(prompt, add_special_tokens=False)["input_ids"]
    assert ctx[0] == bos and ctx.count(bos) == 1
    assert got == pytest.approx(_answer_loss(model, ctx, tok, answer), rel=1e-4)


def test_score_with_original_model_records_nll(tmp_path, tiny_lm):
    model = write_run(tmp_path / "m", suite([1.0, 2.0], generations=["author writes books", "cats rain"]))
    report = score.score_runs([model], original_model=tiny_lm)
    rows = [r for r in report["per_item"] if r["task"] == "tofu_forget10"]
    assert all(r["nll_original"] is not None and r["nll_original"] > 0 for r in rows)
    fm = report["runs"][0]["failure_modes"]["tofu_forget10"]
    assert fm["mean_nll_original"] == pytest.approx(np.mean([r["nll_original"] for r in rows]))
    assert fm["nll_under_original"] == str(tiny_lm)


def _lm_eval_run(model_dir, data_dir, out_dir, tasks_dir):
    """What `lm_eval run --output_path out_dir --log_samples` writes, done in-process."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from cru_harness.lmeval.registration import register

    register()
    tracker = EvaluationTracker(output_path=str(out_dir))
    results = lm_eval.simple_evaluate(
        model="cru", model_args=f"pretrained={model_dir},dtype=float32", tasks=["tofu_forget10_suite"],
        task_manager=TaskManager(include_path=str(tasks_dir), include_defaults=False,
                                 metadata={"data_dir": str(data_dir)}),
        log_samples=True, batch_size=32, device="cpu", gen_kwargs={"max_gen_toks": 8}, bootstrap_iters=0,
        evaluation_tracker=tracker,
    )
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for task_name in results["configs"]:
        tracker.save_results_samples(task_name=task_name, samples=samples[task_name])
    return results, samples


@pytest.mark.slow
def test_score_on_the_tiny_fictitious_world(tmp_path):
    """Two tiny random models scored by lm-eval on the testbed world; `score` recomputes MU and FQ from disk."""
    from scipy import stats
    from cru_harness.lmeval.registration import tasks_dir
    from cru_harness.testbed.models import build_tiny_model, save_tiny_model
    from cru_harness.testbed.tokenizer import train_tokenizer
    from cru_harness.testbed.zoo import tiny_world_dir

    world = tiny_world_dir()
    texts = [json.loads(line)["question"] + " " + json.loads(line)["answer"]
             for line in (world / "full.json").read_text().splitlines() if line.strip()]
    tok = train_tokenizer(texts, 1024)
    runs = {}
    for name, seed in (("unlearned", 0), ("retain", 1)):
        model_dir = save_tiny_model(build_tiny_model("llama", tok, seed=seed, n_layers=8, hidden_size=64), tok,
                                    tmp_path / f"{name}_model")
        runs[name] = (tmp_path / f"{name}_out", *_lm_eval_run(model_dir, world, tmp_path / f"{name}_out",
                                                               Path(tasks_dir()) / "tofu" / "tasks"))
    report = score.score_runs([runs["unlearned"][0]], retain_run=runs["retain"][0], data_dir=world)
    run = report["runs"][0]
    results, samples = runs["unlearned"][1], runs["unlearned"][2]
    # Model Utility from the nine lm-eval aggregates
    agg = {t: results["results"][t] for t in ("tofu_retain", "tofu_real_authors", "tofu_world_facts")}
    nine = [agg[t][f"{m},none"] for t in agg for m in ("rouge_l_recall", "probability", "truth_ratio")]
    assert run["model_utility"]["available"], run["model_utility"]
    assert run["model_utility"]["value"] == pytest.approx(stats.hmean(nine))
    # Forget Quality from the two models' logged per-item truth ratios
    ours = [s["truth_ratio"] for s in sorted(samples["tofu_forget10"], key=lambda s: s["doc_id"])]
    theirs = [s["truth_ratio"] for s in sorted(runs["retain"][2]["tofu_forget10"], key=lambda s: s["doc_id"])]
    fq = run["forget_quality"]["tofu_forget10"]
    assert fq["n_items"] == len(ours) == 40
    assert fq["value"] == pytest.approx(stats.ks_2samp(ours, theirs).pvalue)  # scipy directly, as TOFU computes it
    rows = [r for r in report["per_item"] if r["task"] == "tofu_forget10"]
    assert [r["generation"] for r in sorted(rows, key=lambda r: r["doc_id"])] == \
        [s["filtered_resps"][0] for s in sorted(samples["tofu_forget10"], key=lambda s: s["doc_id"])]
    assert sum(run["failure_modes"]["tofu_forget10"]["fractions"].values()) == pytest.approx(1.0)
    assert "idontknow" in run["failure_modes"]["tofu_forget10"]["refusal_phrases"]


def test_generation_prompt_in_both_lm_eval_sample_layouts():
    on_disk = {"gen_args_0": {"arg_0": "Question: q\nAnswer:", "arg_1": {}}, "gen_args_1": {"arg_0": "x"}}
    in_memory = [["Question: q\nAnswer:", {}], ["Question: q\nAnswer:", " a"]]
    assert outputs.generation_prompt(on_disk) == outputs.generation_prompt(in_memory) == "Question: q\nAnswer:"
    assert outputs.generation_prompt(None) is None


def test_runs_that_cannot_be_compared_are_refused_or_named(tmp_path, capsys):
    """`--predict_only` results and a directory holding the newest results of two models (lm-eval writes runs of
    one base with other bundles into one subfolder) are refused; a retain run evaluated under other settings
    than the model's is named beside Forget Quality, and a `--limit` beside the run."""
    predicted = tmp_path / "predicted"
    write_run(predicted, {"tofu_forget10": {"agg": {"bypass": 999}, "items": []}})
    with pytest.raises(score.ScoreInputError, match="tofu_forget10 was run with --predict_only"):
        score.load_run(predicted)

    mixed = tmp_path / "mixed"
    write_run(mixed, suite([1.0, 2.0]), model_args="base=m,routers=a", date="2025-01-01T00-00-00.000000")
    write_run(mixed, {"tofu_forget10": suite([1.0])["tofu_forget10"]}, model_args="base=m,routers=b",
              date="2025-02-01T00-00-00.000000")
    with pytest.raises(score.ScoreInputError, match="holds the newest results of different models: .*routers=b"):
        score.load_run(mixed)

    model, retain = tmp_path / "model", tmp_path / "retain"
    write_run(model, suite([1.0, 2.0]), config={"limit": 2})
    write_run(retain, suite([1.0, 2.0]), top={"chat_template_sha": "abc", "system_instruction": "Be brief."})
    report = score.score_runs([model], retain_run=retain)
    fq = report["runs"][0]["forget_quality"]["tofu_forget10"]
    assert fq["available"] and fq["settings_differ"] == {"limit": [2, None], "chat_template": [False, True],
                                                         "system_instruction": [None, "Be brief."]}
    text = score.format_report(report)
    assert "(lm-eval --limit 2: not the full sets)" in text
    rouge = report["runs"][0]["tasks"]["tofu_forget10"]["rouge_l_recall"]
    # the forget set's ROUGE-L, as the README and the report quote it (not 1 - ROUGE-L under another name)
    assert f"tofu_forget10: forget ROUGE-L {rouge:.4g} (lower: more forgotten); Forget Quality" in text
    assert "evaluated under other settings: limit 2 vs None, chat_template False vs True" in text
    same = score.score_runs([model], retain_run=model)["runs"][0]["forget_quality"]["tofu_forget10"]
    assert "settings_differ" not in same
