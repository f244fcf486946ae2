"""TOFU lm-eval tasks (cru_harness/benchmarks/tofu/tasks): data loading, the combined generate + log-likelihood requests, per-item
scoring, and end-to-end runs on a tiny random model over the real TOFU files."""
from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from cru_harness.protocol import EOS_MARKER, JOINT_MARKER, LoglikelihoodResult, max_length_marker
from cru_harness.benchmarks.tofu.tasks import utils as tofu_utils

TASKS_DIR = Path(tofu_utils.__file__).resolve().parent
ROW_COUNTS = {"tofu_forget10": 400, "tofu_retain": 400, "tofu_real_authors": 100, "tofu_world_facts": 117}


def _result(token_logprobs):
    lp = list(token_logprobs)
    return LoglikelihoodResult(sum(lp), False, lp, [0.0] * len(lp), [1.0] * len(lp))


def _task_manager(tofu_dir):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata={"data_dir": str(tofu_dir)})


# ------------------------------------------------------------------------------------------- data


@pytest.mark.shared_data
def test_load_dataset_row_counts_and_fields(tofu_dir):
    counts = {"forget01_perturbed": 40, "forget10_perturbed": 400, "retain_perturbed": 400,
              "real_authors_perturbed": 100, "world_facts_perturbed": 117}
    for config, n in counts.items():
        ds = tofu_utils.load_tofu_dataset(tofu_config=config, data_dir=str(tofu_dir), version=1.0,
                                          pretrained="ignored-model-arg")["train"]
        assert len(ds) == n, config
        row = ds[0]
        assert set(row) == {"question", "answer", "paraphrased_answer", "perturbed_answer"}
        assert len(row["perturbed_answer"]) == (3 if config.startswith(("real", "world")) else 5)
    # RA / WF have no paraphrase: the answer itself is compared with the perturbed answers
    ra = tofu_utils.load_tofu_dataset(tofu_config="real_authors_perturbed", data_dir=str(tofu_dir))["train"][0]
    assert ra["paraphrased_answer"] == ra["answer"]


def test_unknown_config_is_a_clear_error():
    with pytest.raises(ValueError, match="tofu_config must be one of .*forget10_perturbed"):
        tofu_utils.load_tofu_dataset(tofu_config="forget20_perturbed")


def test_missing_field_is_a_clear_error(tmp_path):
    import json

    (tmp_path / "forget10_perturbed.json").write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    with pytest.raises(Exception, match="paraphrased_answer"):
        tofu_utils.load_tofu_dataset(tofu_config="forget10_perturbed", data_dir=str(tmp_path))


# ------------------------------------------------------------------------------------------- scoring


def test_process_results_forget_item_by_hand():
    doc = {"question": "Who wrote X?", "answer": "Jane Doe wrote X", "paraphrased_answer": "X is by Jane Doe",
           "perturbed_answer": ["a", "b", "c", "d", "e"]}
    answer = _result([-0.5, -1.5])                    # avg nll 1.0
    para = _result([-2.0, -2.0, -2.0])                # avg nll 2.0
    perturbed = [_result([-x]) for x in (1.0, 2.0, 3.0, 4.0, 5.0)]  # mean avg nll 3.0
    out = tofu_utils.process_results(doc, ["Jane Doe wrote it", answer, para, *perturbed])
    assert out["probability"] == pytest.approx(math.exp(-1.0))
    assert out["truth_ratio"] == pytest.approx(math.exp(2.0 - 3.0))  # R = P_wrong / P_right
    assert out["rouge_l_recall"] == pytest.approx(3 / 4)         # "jane doe wrote" of "jane doe wrote x"
    assert (out["nll_answer"], out["nll_paraphrased"], out["nll_perturbed"]) == pytest.approx((1.0, 2.0, 3.0))


def test_process_results_mc_item_by_hand():
    doc = {"question": "Who wrote Hamlet?", "answer": "William Shakespeare", "paraphrased_answer": "William Shakespeare",
           "perturbed_answer": ["Charles Dickens", "Mark Twain", "Jane Austen"]}
    nlls = [0.5, 1.0, 2.0, 3.0]
    out = tofu_utils.process_results(doc, ["Shakespeare"] + [_result([-x]) for x in nlls])
    p = np.exp(-np.array(nlls))
    assert out["probability"] == pytest.approx(p[0] / p.sum())
    assert out["truth_ratio"] == pytest.approx(math.exp(0.5 - 2.0))
    assert out["rouge_l_recall"] == pytest.approx(0.5)


def test_plain_hf_results_give_nan_with_one_warning(monkeypatch):
    monkeypatch.setattr(tofu_utils, "_warned_plain_results", False)
    doc = {"question": "q", "answer": "a b", "paraphrased_answer": "a b", "perturbed_answer": ["c", "d", "e"]}
    plain = [(-1.0, False)] * 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = tofu_utils.process_results(doc, ["a b", *plain])
        second = tofu_utils.process_results(doc, ["a", *plain])
    messages = [str(w.message) for w in caught if "--model cru" in str(w.message)]
    assert len(messages) == 1
    assert first["rouge_l_recall"] == 1.0 and second["rouge_l_recall"] == 0.5
    for key in ("probability", "truth_ratio", "nll_answer"):
        assert math.isnan(first[key]) and math.isnan(second[key])
    assert math.isnan(tofu_utils.truth_ratio_utility_agg([0.5, float("nan")]))


def test_wrong_number_of_results_is_an_error():
    doc = {"question": "q", "answer": "a", "paraphrased_answer": "p", "perturbed_answer": ["c", "d", "e"]}
    with pytest.raises(ValueError, match="log-likelihood results"):
        tofu_utils.process_results(doc, ["a", _result([-1.0])])
    with pytest.raises(TypeError, match="generation"):
        tofu_utils.process_results(doc, [_result([-1.0])] * 5)


def test_aggregations_follow_the_protocol():
    ratios = [0.5, 2.0, 1.0, 0.25]
    assert tofu_utils.truth_ratio_forget_agg(ratios) == pytest.approx(np.mean([0.5, 0.5, 1.0, 0.25]))
    assert tofu_utils.truth_ratio_utility_agg(ratios) == pytest.approx(np.mean([0.5, 0.0, 0.0, 0.75]))


# ------------------------------------------------------------------------------------------- task config


@pytest.mark.shared_data
def test_suite_builds_both_request_types_per_item(tofu_dir):
    loaded = _task_manager(tofu_dir).load(["tofu_forget10_suite"])
    tasks = loaded["tasks"]
    assert set(tasks) == set(ROW_COUNTS)
    assert "tofu_forget10_suite" in {getattr(g, "name", str(g)) for g in loaded["groups"].values()} | set(loaded["groups"])
    forget = tasks["tofu_forget10"]
    forget.build_all_requests(limit=2, rank=0, world_size=1)
    doc = forget.dataset["train"][0]
    first = [inst for inst in forget.instances if inst.doc_id == 0]
    assert [inst.request_type for inst in first] == ["generate_until"] + ["loglikelihood"] * 7
    ctx = f"Question: {doc['question']}\nAnswer:"
    assert first[0].arguments[0] == ctx
    gen_kwargs = first[0].arguments[1]
    # EOS is the only stop (open-unlearning configs/generation/default.yaml:1-5 has no stopwords; the old
    # "\nQuestion:" stop was the project's, not the reference's)
    assert gen_kwargs["max_gen_toks"] == 200 and gen_kwargs["until"] == [] and not gen_kwargs["do_sample"]
    continuations = [inst.arguments[1] for inst in first[1:]]
    expected = [doc["answer"], doc["paraphrased_answer"], *doc["perturbed_answer"]]
    assert continuations == [f"{JOINT_MARKER} {a}{EOS_MARKER}" for a in expected]
    assert forget.config.metadata["tofu_preset"] == "open-unlearning"  # recorded in the results' configs
    assert all(inst.arguments[0] == ctx for inst in first[1:])
    ra = tasks["tofu_real_authors"]
    ra.build_all_requests(limit=1, rank=0, world_size=1)
    assert [inst.request_type for inst in ra.instances] == ["generate_until"] + ["loglikelihood"] * 4
    # forget and utility sets aggregate the truth ratio differently
    assert forget.aggregation()["truth_ratio"]([2.0]) == pytest.approx(0.5)
    assert tasks["tofu_retain"].aggregation()["truth_ratio"]([0.25]) == pytest.approx(0.75)


def test_unknown_split_in_yaml_is_a_clear_error(tmp_path):
    from lm_eval.tasks import TaskManager

    (tmp_path / "bad.yaml").write_text(
        f"include: {TASKS_DIR / '_default_template_yaml'}\ntask: tofu_bad\ndataset_kwargs:\n  tofu_config: forget20\n"
    )
    tm = TaskManager(include_path=str(tmp_path), include_defaults=False)
    with pytest.raises(ValueError, match="tofu_config must be one of"):
        tm.load(["tofu_bad"])


# ------------------------------------------------------------------------------------------- end to end


@pytest.fixture
def one_torch_thread():
    """One intra-op thread: on a shared 2-core machine this runs the tiny model ~3x faster than two."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tofu_dir):
    """A tiny random llama (8 layers, hidden 64) with a BPE tokenizer trained on TOFU text (chat template on)."""
    import json

    from cru_harness.testbed.models import build_tiny_model, save_tiny_model
    from cru_harness.testbed.tokenizer import train_tokenizer

    texts = []
    for name in ("full", "real_authors_perturbed", "world_facts_perturbed"):
        with open(tofu_dir / f"{name}.json", encoding="utf-8") as handle:
            for line in handle:
                row = json.loads(line)
                texts.append(f"Question: {row['question']}\nAnswer: {row['answer']}")
    tokenizer = train_tokenizer(texts, 2048, chat_template=True)
    model = build_tiny_model("llama", tokenizer, n_layers=8, hidden_size=64)
    return save_tiny_model(model, tokenizer, tmp_path_factory.mktemp("tiny_tofu_model"))


def _evaluate(model_dir, tofu_dir, tasks, *, model="cru", limit=None, max_gen_toks=8, model_args="", **kwargs):
    import lm_eval

    from cru_harness.lmeval.registration import register

    register()
    return lm_eval.simple_evaluate(
        model=model, model_args=f"pretrained={model_dir},dtype=float32{model_args}", tasks=tasks,
        task_manager=_task_manager(tofu_dir), limit=limit, log_samples=True, batch_size=32, device="cpu",
        gen_kwargs={"max_gen_toks": max_gen_toks}, bootstrap_iters=0, **kwargs,
    )


@pytest.mark.slow
@pytest.mark.shared_data
def test_forget10_suite_end_to_end_all_rows(tiny_model_dir, tofu_dir, one_torch_thread):
    """The whole suite through the project's `cru` model (lm-eval's `hf` gives NaN probabilities: its own
    test below)."""
    start = time.perf_counter()
    res = _evaluate(tiny_model_dir, tofu_dir, ["tofu_forget10_suite"], model="cru")
    elapsed = time.perf_counter() - start
    print(f"tofu_forget10_suite, all rows, model=cru: {elapsed:.1f}s")
    assert elapsed < 1200  # a guard against pathological slowness, not a benchmark (see the report)
    for task, n in ROW_COUNTS.items():
        samples = res["samples"][task]
        assert len(samples) == n, task
        assert res["results"][task]["sample_len"] == n
        assert sorted(s["doc_id"] for s in samples) == list(range(n))
        for s in samples:
            assert isinstance(s["filtered_resps"][0], str)  # the generation rides with the item
            assert 0.0 <= s["rouge_l_recall"] <= 1.0
            for key in ("probability", "truth_ratio", "nll_answer", "nll_paraphrased", "nll_perturbed"):
                assert math.isfinite(s[key]), (task, key, s["doc_id"])
        agg = res["results"][task]
        probs = [s["probability"] for s in samples]
        assert agg["probability,none"] == pytest.approx(np.mean(probs))
        ratios = np.array([s["truth_ratio"] for s in samples])
        expected_tr = (np.mean(np.minimum(ratios, 1 / ratios)) if task == "tofu_forget10"
                       else np.mean(np.maximum(0, 1 - ratios)))
        assert agg["truth_ratio,none"] == pytest.approx(expected_tr)
    assert set(res["group_subtasks"]["tofu_forget10_suite"]) == set(ROW_COUNTS)


@pytest.mark.slow
@pytest.mark.shared_data
def test_hf_model_reports_nan_probability(tiny_model_dir, tofu_dir):
    # the user is told why, and what to use instead
    with pytest.warns(RuntimeWarning, match=r"reported as NaN.*Use `--model cru`"):
        res = _evaluate(tiny_model_dir, tofu_dir, ["tofu_world_facts"], model="hf", limit=3)
    agg = res["results"]["tofu_world_facts"]
    assert math.isnan(agg["probability,none"]) and math.isnan(agg["truth_ratio,none"])
    assert 0.0 <= agg["rouge_l_recall,none"] <= 1.0


DATE_TEMPLATE = (
    "{% if not date_string is defined %}{% set date_string = strftime_now('%d %b %Y') %}{% endif %}"
    "<|system|>\nToday Date: {{ date_string }}<|eos|>\n"
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|eos|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.mark.slow
@pytest.mark.shared_data
def test_chat_template_prompt_and_pinned_date(tiny_model_dir, tofu_dir, tmp_path, monkeypatch):
    """Question as the user message, the answer right after the assistant header, and a date-injecting template
    rendered with the pinned date whatever today is."""
    import shutil

    from transformers import AutoTokenizer

    from cru_harness.protocol import SYSTEM_PROMPT
    from cru_harness.prompts import OPEN_UNLEARNING_DATE

    model_dir = tmp_path / "dated"
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "chat_template.jinja").unlink(missing_ok=True)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = DATE_TEMPLATE
    tok.save_pretrained(model_dir)

    import transformers.utils.chat_template_utils as ctu

    runs = []
    for fake_today in ("01 Jan 2031", "15 Mar 2032"):
        # what transformers' `strftime_now` would return on two different days
        monkeypatch.setattr(ctu, "datetime", _FrozenDatetime.at(fake_today), raising=False)
        res = _evaluate(model_dir, tofu_dir, ["tofu_real_authors"], limit=2, max_gen_toks=4,
                        apply_chat_template=True, system_instruction=SYSTEM_PROMPT)
        runs.append(res)
    samples = [r["samples"]["tofu_real_authors"] for r in runs]
    prompt = samples[0][0]["arguments"][0][0]
    question = samples[0][0]["doc"]["question"]
    assert f"<|user|>\n{question}<|eos|>" in prompt and "Question:" not in prompt
    assert f"<|system|>\n{SYSTEM_PROMPT}" in prompt
    assert prompt.endswith("<|assistant|>\n")
    assert OPEN_UNLEARNING_DATE.strftime("%d %b %Y") in prompt  # open-unlearning's date_string
    assert "2031" not in prompt
    # the scored text is the rest of the finished conversation: answer + the template's end of turn (+ EOS if
    # missing), open-unlearning src/data/utils.py:61-124
    assert samples[0][0]["arguments"][1][1] == f"{JOINT_MARKER}{samples[0][0]['doc']['answer']}<|eos|>\n{EOS_MARKER}"
    assert [s["arguments"] for s in samples[0]] == [s["arguments"] for s in samples[1]]
    for a, b in zip(samples[0], samples[1]):
        assert a["probability"] == b["probability"] and a["filtered_resps"] == b["filtered_resps"]


class _FrozenDatetime:
    """A stand-in for the `datetime` class transformers' `strftime_now` calls `.now()` on."""

    @staticmethod
    def at(day: str):
        import datetime as dt

        frozen = dt.datetime.strptime(day, "%d %b %Y")

        class Frozen(dt.datetime):
            @classmethod
            def now(cls, tz=None):
                return frozen

        return Frozen


@pytest.mark.slow
@pytest.mark.shared_data
def test_legacy_preset_end_to_end_records_the_preset(tiny_model_dir, tofu_dir):
    """`--metadata '{"tofu_preset": "legacy", "tofu_model_family": "phi"}'` through lm-eval: TOFU's phi format,
    200 tokens in total (HF max_length), the preset in the results' task config."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from cru_harness.lmeval.registration import register

    register()
    tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                     metadata={"data_dir": str(tofu_dir), "tofu_preset": "legacy", "tofu_model_family": "phi"})
    res = lm_eval.simple_evaluate(model="cru", model_args=f"pretrained={tiny_model_dir},dtype=float32",
                                  tasks=["tofu_world_facts"], task_manager=tm, limit=2, log_samples=True,
                                  batch_size=4, device="cpu", bootstrap_iters=0)
    sample = res["samples"]["tofu_world_facts"][0]
    question = sample["doc"]["question"]
    assert sample["arguments"][0][0] == f"Question: {question}\n"  # evaluate_util.py:307-309 drops "Answer: "
    assert sample["arguments"][0][1]["max_length"] == 200
    # the scored text is cut at 200 tokens, as TOFU's dataset cuts it (data_module.py:15-27)
    assert sample["arguments"][1] == (f"Question: {question}\n", f"{JOINT_MARKER}{max_length_marker(200)}Answer: "
                                                                 f"{sample['doc']['answer']}{EOS_MARKER}")
    assert res["configs"]["tofu_world_facts"]["metadata"]["tofu_preset"] == "legacy"
    assert math.isfinite(res["results"]["tofu_world_facts"]["probability,none"])


@pytest.mark.shared_data
def test_a_system_instruction_without_a_chat_template_is_used_or_refused(tofu_dir, monkeypatch, caplog):
    """lm-eval records `--system_instruction` in the results: without a chat template the plain prompt puts it
    first (with a warning), in the generation and the scored requests alike; a fixed format, which has no place
    for one, refuses it in one line."""
    from cru_harness.prompts import PresetError

    monkeypatch.setattr(tofu_utils.TOFUTask, "_warned_system", False)
    task = _task_manager(tofu_dir).load(["tofu_retain"])["tasks"]["tofu_retain"]
    with caplog.at_level("WARNING"):
        task.build_all_requests(limit=1, rank=0, world_size=1, system_instruction="Answer briefly.")
    question = task.dataset["train"][0]["question"]
    assert {inst.arguments[0] for inst in task.instances} == {f"Answer briefly.\n\nQuestion: {question}\nAnswer:"}
    assert "the numbers are not the preset's" in caplog.text

    from lm_eval.tasks import TaskManager

    legacy = TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                         metadata={"data_dir": str(tofu_dir), "tofu_preset": "legacy", "tofu_model_family": "phi"})
    task = legacy.load(["tofu_retain"])["tasks"]["tofu_retain"]
    with pytest.raises(PresetError, match="without a system prompt: run it without --system_instruction"):
        task.build_all_requests(limit=1, rank=0, world_size=1, system_instruction="Answer briefly.")


@pytest.mark.slow
@pytest.mark.shared_data
def test_data_parallel_lm_eval_gives_one_process_numbers(tiny_model_dir, tofu_dir, tmp_path):
    """`accelerate launch -m lm_eval --model cru` with routers: 2 processes (gloo, on the CPU) score forget01 as
    one process does. lm-eval's HFLM enters its data-parallel branch only when it counts GPUs, so the launched
    script reports two; everything else (sharding, gathering, aggregation) is lm-eval's and the project's own."""
    import json
    import os
    import subprocess
    import sys

    from cru_harness.cli import main

    bundle = tmp_path / "bundle"
    assert main(["unlearn", "--base", str(tiny_model_dir), "--forget", "forget01", "--retain", "retain99",
                 "--data-dir", str(tofu_dir), "--out", str(bundle), "--last-k", "2", "--d-r", "4", "--epochs", "1",
                 "--max-length", "64", "--no-progress"]) == 0
    script = tmp_path / "lm_eval_two_gpus.py"
    script.write_text("import runpy, sys, torch\ntorch.cuda.device_count = lambda: 2\n"
                      "sys.argv = ['lm_eval'] + sys.argv[1:]\nrunpy.run_module('lm_eval', run_name='__main__')\n")
    args = ["--model", "cru", "--model_args", f"base={tiny_model_dir},routers={bundle}", "--tasks", "tofu_forget01",
            "--device", "cpu", "--batch_size", "8", "--gen_kwargs", "max_gen_toks=8", "--log_samples",
            "--metadata", json.dumps({"data_dir": str(tofu_dir)})]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", ACCELERATE_USE_CPU="1")
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script)]
    runs = {}
    for name, prefix in (("one", [sys.executable, str(script)]), ("two", launch)):
        proc = subprocess.run(prefix + args + ["--output_path", str(tmp_path / name)], capture_output=True,
                              text=True, timeout=600, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[name] = (proc.stderr, json.loads(next((tmp_path / name).rglob("results_*.json")).read_text()))
    assert "on rank 1" in runs["two"][0] and "on rank 1" not in runs["one"][0]   # two shards, or none
    one, two = runs["one"][1], runs["two"][1]
    assert two["n-samples"]["tofu_forget01"]["effective"] == 40
    numbers = {k: v for k, v in one["results"]["tofu_forget01"].items() if isinstance(v, float)}
    assert {"probability,none", "truth_ratio,none", "rouge_l_recall,none"} <= set(numbers)
    assert {k: two["results"]["tofu_forget01"][k] for k in numbers} == pytest.approx(numbers, rel=1e-6, abs=1e-9)


# ------------------------------------------------------------------------------------------- privacy tasks


@pytest.mark.shared_data
def test_privacy_dataset_alternates_forget_and_holdout_rows(tofu_dir):
    docs = tofu_utils.load_tofu_privacy_dataset(tofu_config="forget01_perturbed", data_dir=str(tofu_dir))["train"]
    assert len(docs) == 80 and [d["set"] for d in docs.select(range(4))] == ["forget", "holdout"] * 2
    forget = [d["question"] for d in docs if d["set"] == "forget"]
    holdout = [d["question"] for d in docs if d["set"] == "holdout"]
    assert len(forget) == len(holdout) == 40 and not set(forget) & set(holdout)
    with pytest.raises(Exception, match="run them with tofu_preset=open-unlearning"):
        tofu_utils.load_tofu_privacy_dataset(tofu_config="forget01_perturbed", data_dir=str(tofu_dir),
                                             tofu_preset="legacy")
    with pytest.raises(ValueError, match="tofu_config must be one of"):
        tofu_utils.load_tofu_privacy_dataset(tofu_config="retain_perturbed", data_dir=str(tofu_dir))


def _privacy_result(lp, greedy, text="the answer", gradnorm=None):
    return LoglikelihoodResult(sum(lp), all(greedy), lp, [-1.0] * len(lp), [0.5] * len(lp), greedy, text,
                               gradnorm=gradnorm)


def test_privacy_items_and_aggregations_by_hand():
    from sklearn.metrics import roc_auc_score

    from cru_harness import metrics as M

    lp = [-0.5, -2.0, -0.1, -3.0, -0.2, -1.0]   # the last stands for EOS
    greedy = [False, True, True, True, True, False]
    out = tofu_utils.process_privacy_results({"set": "holdout"}, [_privacy_result(lp, greedy, gradnorm=0.25)])
    assert out["mia_gradnorm"] == [1, 0.25]
    # a result without the score (computed without MIA_MARKER): NaN, so the AUC is NaN, never a wrong number
    assert math.isnan(tofu_utils.process_privacy_results({"set": "forget"}, [_privacy_result(lp, greedy)])[
        "mia_gradnorm"][1])
    assert out["mia_loss"] == [1, pytest.approx(np.mean([0.5, 2.0, 0.1, 3.0, 0.2, 1.0]))]
    assert out["mia_min_k"] == [1, pytest.approx((3.0 + 2.0) / 2)]   # 5 tokens without EOS, k=0.4 keeps 2
    assert out["mia_min_k_plus_plus"][1] == pytest.approx(M.min_k_plus_plus_attack(lp[:-1], [-1.0] * 5, [0.5] * 5))
    assert out["mia_zlib"][1] == pytest.approx(M.loss_attack(lp) / len(__import__("zlib").compress(b"the answer")))
    assert out["exact_memorization"] == [1, 0.8] and out["extraction_strength"] == [1, pytest.approx(0.8)]
    items = [[0, 0.5], [1, 0.7], [0, 0.9], [1, 0.6], [0, 0.2], [1, 0.6]]
    want = roc_auc_score([i[0] for i in items], [i[1] for i in items])   # forget = 0, holdout = 1
    assert tofu_utils.forget_holdout_auc_agg(items) == pytest.approx(want) and want != 0.5
    assert tofu_utils.forget_mean_agg([[0, 0.5], [1, 1.0], [0, None], [0, 0.25]]) == 0.375   # forget rows only
    assert math.isnan(tofu_utils.forget_holdout_auc_agg([[0, 0.5], [0, float("nan")], [1, 0.1]]))
    with pytest.warns(RuntimeWarning, match="needs forget and holdout items"):
        assert math.isnan(tofu_utils.forget_holdout_auc_agg([[0, 0.5], [0, 0.4]]))


@pytest.mark.slow
@pytest.mark.shared_data
def test_privacy_task_end_to_end_matches_the_metrics(tiny_model_dir, tofu_dir, one_torch_thread, tmp_path):
    """tofu_privacy_forget01 through `--model cru`: per-item scores from the answer's token arrays, the AUC from
    them, and the answer scored as the TOFU probes score it (same request as tofu_forget01's answer)."""
    from sklearn.metrics import roc_auc_score

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # a reference model for the reference attack: the same model with its output head scaled
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        reference.get_output_embeddings().weight.mul_(0.5)
    reference.save_pretrained(tmp_path / "reference")
    res = _evaluate(tiny_model_dir, tofu_dir, ["tofu_privacy_forget01", "tofu_forget01"], limit=6,
                    apply_chat_template=True, model_args=f",reference={tmp_path / 'reference'}")
    samples = res["samples"]["tofu_privacy_forget01"]
    assert [s["doc"]["set"] for s in samples] == ["forget", "holdout"] * 3
    for name in tofu_utils.PRIVACY_ATTACKS:
        labels = [s[name][0] for s in samples]
        scores = [s[name][1] for s in samples]
        assert res["results"]["tofu_privacy_forget01"][f"{name},none"] == pytest.approx(
            roc_auc_score(labels, scores))
    # the privacy task's forget rows are scored with the probes' request: LOSS = the probe's answer NLL
    probe = {s["doc"]["question"]: s["nll_answer"] for s in res["samples"]["tofu_forget01"]}
    forget = [s for s in samples if s["doc"]["set"] == "forget"]
    assert all(s["mia_loss"][1] == pytest.approx(probe[s["doc"]["question"]]) for s in forget)
    es = np.mean([s["extraction_strength"][1] for s in forget])
    assert res["results"]["tofu_privacy_forget01"]["extraction_strength,none"] == pytest.approx(es)
    assert 0 < es <= 1
    # GradNorm of the first forget row, by hand: -mean log p of the answer tokens without EOS, one backward pass,
    # the mean over parameters of the gradient's 2-norm (open-unlearning mia/gradnorm.py)
    from cru_harness.scoring.model_scores import encode_rows

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    ((ids, n_prompt),) = encode_rows(tok, [forget[0]["doc"]], chat=True)
    logits = model(input_ids=torch.tensor([ids])).logits[0]
    logp = torch.log_softmax(logits.float(), -1)[torch.arange(n_prompt - 1, len(ids) - 1), torch.tensor(ids[n_prompt:])]
    (-logp[:-1].mean()).backward()
    by_hand = float(np.mean([p.grad.norm().item() for p in model.parameters() if p.grad is not None]))
    assert forget[0]["mia_gradnorm"][1] == pytest.approx(by_hand, rel=1e-4)
    # the reference attack (mia/reference.py): the model's mean loss minus the reference's, EOS included
    with torch.no_grad():
        ref_logits = reference(input_ids=torch.tensor([ids])).logits[0]
    ref_lp = torch.log_softmax(ref_logits.float(), -1)[torch.arange(n_prompt - 1, len(ids) - 1),
                                                       torch.tensor(ids[n_prompt:])]
    own = -float(logp.detach().mean())
    assert forget[0]["mia_reference"][1] == pytest.approx(own - (-float(ref_lp.mean())), rel=1e-4, abs=1e-6)
    assert forget[0]["mia_reference"][1] != pytest.approx(0.0, abs=1e-3)   # the reference differs


def test_tasks_load_without_lm_evals_custom_dataset_hint(caplog):
    """lm-eval 0.4.13 prints "Custom kwargs can be passed to `--metadata` ..." for every task whose rows come from
    a function; the project's task classes load them the same way without it (`QuietCustomDataset`). This
    checkout's task files, on the testbed's world (`data_dir: testbed:world`)."""
    import logging

    from lm_eval.tasks import TaskManager

    from cru_harness.lmeval.dataset import QuietCustomDataset

    checkout_tasks = Path(__file__).resolve().parents[1] / "cru_harness" / "benchmarks" / "tofu" / "tasks"
    manager = TaskManager(include_path=str(checkout_tasks), include_defaults=False,
                          metadata={"data_dir": "testbed:world"})
    with caplog.at_level(logging.WARNING):
        tasks = manager.load(["tofu_forget01", "tofu_retain"])["tasks"]
    assert {name: len(task.dataset["train"]) > 0 for name, task in tasks.items()} == {"tofu_forget01": True,
                                                                                       "tofu_retain": True}
    assert all(isinstance(task, QuietCustomDataset) for task in tasks.values())
    assert not [r.getMessage() for r in caplog.records if "Custom kwargs" in r.getMessage()]
