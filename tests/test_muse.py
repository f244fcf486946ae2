"""MUSE as a benchmark package: data loading, prompts token for token, and each scorer against MUSE's own code.

Reference: swj0419/muse_bench at fcd6651. The reference computations below re-implement, in a few lines each, what
MUSE's files do (`metrics/logger.py` RougeEvalLogger, `metrics/verbmem.py`, `metrics/knowmem.py`,
`metrics/privleak.py` compute_ppl / inference / sweep, `eval.py` privleak) with the libraries MUSE calls
(rouge_score without a stemmer, sklearn's roc_curve and auc). The data is the fictitious fixture of
tests/muse_fixture.py in MUSE's schema; none of MUSE's text is used.

Deliberate differences, asserted where they show:
- M1 Min-40% of a text shorter than 1/0.4 tokens: MUSE averages an empty slice (NaN); one token is kept here.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from cru_harness.benchmarks.muse import data as muse_data
from cru_harness.benchmarks.muse import metrics as muse_metrics
from cru_harness.benchmarks.muse import prompts as muse_prompts
from cru_harness.benchmarks.muse import tasks_dir
from cru_harness.benchmarks.muse.tasks import utils as muse_utils
from cru_harness.data.sources import DataSourceError
from cru_harness.protocol import LoglikelihoodResult

from muse_fixture import fixture_rows, write_muse_fixture

MUSE_TASKS = [f"muse_{c}_{s}" for c in ("news", "books") for s in ("verbmem_f", "knowmem_f", "knowmem_r", "privleak")]


@pytest.fixture(scope="module")
def muse_dir(tmp_path_factory) -> Path:
    return write_muse_fixture(tmp_path_factory.mktemp("muse"))


@pytest.fixture(autouse=True)
def _no_env_copy(monkeypatch):
    for name in (muse_data.ENV_MUSE_DIR, "CRU_HARNESS_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)


# ------------------------------------------------------------------------------------------------------ data

@pytest.mark.parametrize("layout", ["hub", "json"])
def test_every_split_loads_from_a_local_copy(tmp_path, layout):
    root = write_muse_fixture(tmp_path, layout=layout)
    for corpus in muse_data.CORPORA:
        expected = fixture_rows(corpus)
        for config, splits in muse_data.SPLITS.items():
            for split in splits:
                assert muse_data.load_split(corpus, config, split, root) == expected[(config, split)]
    # the corpus folder itself, and the Hub repo's folder name, are copies too
    assert muse_data.resolve_local_dir("news", root / "news") == root / "news"
    (root / "news").rename(root / "MUSE-News")
    assert muse_data.resolve_local_dir("news", root) == root / "MUSE-News"


def test_env_variable_names_the_copy(muse_dir, monkeypatch):
    monkeypatch.setenv(muse_data.ENV_MUSE_DIR, str(muse_dir))
    assert muse_data.resolve_local_dir("books") == muse_dir / "books"


def test_bad_local_copies_fail_in_one_line(tmp_path, muse_dir):
    with pytest.raises(DataSourceError, match="is not a directory"):
        muse_data.load_split("news", "raw", "forget", tmp_path / "nowhere")
    (tmp_path / "other").mkdir()
    with pytest.raises(DataSourceError, match="holds no MUSE books data"):
        muse_data.load_split("books", "raw", "forget", tmp_path / "other")
    with pytest.raises(ValueError, match="unknown MUSE corpus 'wiki'"):
        muse_data.load_split("wiki", "raw", "forget", muse_dir)
    with pytest.raises(ValueError, match="has no split 'forget_5'"):
        muse_data.load_split("news", "scal", "forget_5", muse_dir)
    broken = write_muse_fixture(tmp_path / "broken", layout="json", corpora=("news",))
    (broken / "news" / "knowmem" / "forget_qa.json").write_text('[{"question": "Q?"}]')
    with pytest.raises(DataSourceError, match="row 0 has no text field answer"):
        muse_data.load_split("news", "knowmem", "forget_qa", broken)


def test_no_copy_and_no_hub_is_one_clear_line_quickly(monkeypatch):
    """Offline: the error names the Hub dataset and the local options, without datasets' half-minute retries."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.time()
    with pytest.raises(DataSourceError) as err:
        muse_data.load_split("books", "verbmem", "forget")
    message = str(err.value)
    assert "\n" not in message and "muse-bench/MUSE-Books" in message
    assert muse_data.ENV_MUSE_DIR in message and "data_dir" in message
    assert time.time() - start < 60   # datasets' own retries take minutes when it tries the network


def test_unreachable_hub_is_probed_once_without_retries(monkeypatch):
    import datasets
    import huggingface_hub

    class ConnectError(Exception):
        pass

    calls = []

    def refuse(self, repo, **kwargs):
        calls.append(repo)
        raise ConnectError("Name or service not known")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", refuse)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("retried the Hub through datasets"))
    muse_data._unreachable.cache_clear()
    try:
        for _ in range(2):
            with pytest.raises(DataSourceError, match="muse-bench/MUSE-News .*ConnectError"):
                muse_data.load_split("news", "privleak", "holdout")
        assert calls == ["muse-bench/MUSE-News"]
    finally:
        muse_data._unreachable.cache_clear()


def _real_muse_dir(environ=None) -> str:
    """A real MUSE copy (the Hub's layout or MUSE's data/ folder): CRU_HARNESS_MUSE_DIR, else `muse/` in the shared
    data folder; else a skip (conftest's `optional_data_dir`: the shared folder holds no MUSE)."""
    from conftest import optional_data_dir

    hint = (f"a snapshot_download of {muse_data.HUB_IDS['news']} and {muse_data.HUB_IDS['books']}, or MUSE's "
            "load_data.py data/")
    return str(optional_data_dir(muse_data.ENV_MUSE_DIR, "muse", "MUSE", hint, environ))


@pytest.fixture(scope="module")
def real_muse() -> str:
    return _real_muse_dir()


def test_real_muse_copy_is_read_when_given_and_skipped_otherwise(tmp_path, monkeypatch):
    """No copy: a skip naming the variable, under CRU_HARNESS_REQUIRE_DATA=1 too; a given copy is used; a variable
    naming no folder fails."""
    monkeypatch.setenv("CRU_HARNESS_SHARED_DATA", str(tmp_path / "shared"))
    with pytest.raises(pytest.skip.Exception, match="CRU_HARNESS_MUSE_DIR"):
        _real_muse_dir({"CRU_HARNESS_REQUIRE_DATA": "1"})
    assert _real_muse_dir({muse_data.ENV_MUSE_DIR: str(tmp_path)}) == str(tmp_path)
    (tmp_path / "shared" / "muse").mkdir(parents=True)
    assert _real_muse_dir({"CRU_HARNESS_REQUIRE_DATA": "1"}) == str(tmp_path / "shared" / "muse")
    with pytest.raises(pytest.fail.Exception, match="not a folder"):
        _real_muse_dir({muse_data.ENV_MUSE_DIR: str(tmp_path / "absent")})


@pytest.mark.parametrize("corpus", muse_data.CORPORA)
def test_real_muse_copy_has_muses_schema(corpus, real_muse):
    """On MUSE's own files: every config and split the tasks and corpora read loads, in MUSE's schema (scal and
    sust exist for News only in MUSE's load_data.py), with the Hub card's row counts."""
    for config, splits in muse_data.SPLITS.items():
        if config in ("scal", "sust") and corpus == "books":
            continue
        for split in splits:
            rows = muse_data.load_split(corpus, config, split, real_muse)
            assert rows and all(set(r) == set(muse_data.FIELDS[config]) for r in rows)
    # the evaluation sets (the Hub's dataset cards): 100 prompts, 100 questions per side with 10 in-context pairs,
    # 100 texts per PrivLeak set
    assert len(muse_data.load_split(corpus, "verbmem", "forget", real_muse)) == 100
    for split, n in (("forget_qa", 100), ("retain_qa", 100), ("forget_qa_icl", 10), ("retain_qa_icl", 10)):
        assert len(muse_data.load_split(corpus, "knowmem", split, real_muse)) == n
    for split in muse_data.SPLITS["privleak"]:
        assert len(muse_data.load_texts(corpus, "privleak", split, real_muse)) == 100
    docs = muse_utils.load_rows(corpus, "knowmem_f", real_muse)
    assert all(d["prompt"].endswith("\nAnswer: ") and d["prompt"].count("Question: ") > 1 for d in docs)


def _check_folds(root) -> list[str]:
    """Fold 1 of scalability and sustainability is the raw forget split (why the runner's folds start at 2);
    scalability's forget sets grow, each holding the one before; sustainability's later requests are new texts."""
    forget = muse_data.load_texts("news", "raw", "forget", root)
    scal = [muse_data.load_texts("news", "scal", f"forget_{k}", root) for k in range(1, 5)]
    sust = [muse_data.load_texts("news", "sust", f"forget_{k}", root) for k in range(1, 5)]
    assert scal[0] == forget and sust[0] == forget
    assert all(set(a) <= set(b) and len(a) < len(b) for a, b in zip(scal, scal[1:]))
    assert all(not set(later) & set(forget) for later in sust[1:])
    return forget


def test_fixture_folds_are_muses(muse_dir):
    _check_folds(muse_dir)


def test_real_muse_news_folds_start_at_the_forget_split(real_muse):
    assert len(_check_folds(real_muse)) == 889   # the Hub card's raw forget rows


# --------------------------------------------------------------------------------------- prompts, token for token

def _lm(tokenizer):
    from cru_harness.lmeval.model import CRULM
    from cru_harness.testbed.models import build_tiny_model

    model = build_tiny_model("llama", tokenizer, n_layers=1, hidden_size=16)
    return CRULM(pretrained=model, tokenizer=tokenizer, device="cpu", batch_size=1)


@pytest.fixture(scope="module")
def lm():
    from cru_harness.testbed.tokenizer import train_tokenizer

    texts = [r.get("text") or r.get("prompt", "") + r.get("gt", "") or f"Question: {r['question']}\nAnswer: "
             f"{r['answer']}\n\n" for rows in fixture_rows("news").values() for r in rows] * 4
    return _lm(train_tokenizer(texts, 400))


_MANAGERS: dict = {}


def _requests(muse_dir, names):
    from lm_eval.tasks import TaskManager

    if muse_dir not in _MANAGERS:
        _MANAGERS[muse_dir] = TaskManager(include_path=tasks_dir(), include_defaults=False,
                                          metadata={"data_dir": str(muse_dir)})
    tasks = _MANAGERS[muse_dir].load(list(names))["tasks"]
    out = {}
    for name, task in tasks.items():
        task.build_all_requests(rank=0, world_size=1)
        out[name] = sorted(task.instances, key=lambda i: (i.doc_id, i.idx))
    return out


def _muse_knowmem_prompt(qa_row, icl_rows):
    """metrics/knowmem.py: the ICL pairs joined, then the question."""
    general_prompt = ""
    for row in icl_rows:
        general_prompt += f"Question: {row['question']}\nAnswer: {row['answer']}\n\n"
    return general_prompt + f"Question: {qa_row['question']}\nAnswer: "


@pytest.mark.parametrize("corpus", muse_data.CORPORA)
def test_generation_prompts_are_muses_token_for_token(corpus, muse_dir, lm):
    tok = lm.tokenizer
    rows = fixture_rows(corpus)
    names = [f"muse_{corpus}_verbmem_f", f"muse_{corpus}_knowmem_f", f"muse_{corpus}_knowmem_r"]
    requests = _requests(muse_dir, names)
    verbmem = requests[names[0]]
    assert len(verbmem) == len(rows[("verbmem", "forget")])
    for inst, row in zip(verbmem, rows[("verbmem", "forget")]):
        context, gen = inst.arguments
        ids, _ = lm.tok_batch_encode([context])   # what generate_until feeds the model
        assert ids[0].tolist() == tok(row["prompt"], return_tensors="pt", add_special_tokens=True).input_ids[0].tolist()
        assert gen["max_gen_toks"] == 128 and gen["do_sample"] is False and not gen["until"]
    for name, part in zip(names[1:], ("forget", "retain")):
        qa, icl = rows[("knowmem", f"{part}_qa")], rows[("knowmem", f"{part}_qa_icl")]
        assert len(requests[name]) == len(qa)
        for inst, row in zip(requests[name], qa):
            context, gen = inst.arguments
            ids, _ = lm.tok_batch_encode([context])
            expected = tok(_muse_knowmem_prompt(row, icl), return_tensors="pt", add_special_tokens=True).input_ids
            assert ids[0].tolist() == expected[0].tolist()
            assert gen["max_gen_toks"] == 32 and gen["until"] == ["\n\n", "\nQuestion", "Question:"]


@pytest.mark.parametrize("corpus", muse_data.CORPORA)
def test_privleak_scores_muses_tokens(corpus, muse_dir, lm):
    """metrics/privleak.py compute_ppl: tokenizer.encode(text) (special tokens on), every token after the first."""
    tok = lm.tokenizer
    instances = _requests(muse_dir, [f"muse_{corpus}_privleak"])[f"muse_{corpus}_privleak"]
    rows = fixture_rows(corpus)
    forget = [r["text"] for r in rows[("privleak", "forget")]]
    holdout = [r["text"] for r in rows[("privleak", "holdout")]]
    assert sorted(i.doc["text"] for i in instances) == sorted(forget + holdout)
    assert [i.doc["member"] for i in instances[:4]] == [False, True, False, True]   # interleaved: --limit keeps both
    for inst in instances:
        ids = tok.encode(inst.doc["text"])
        assert lm.encode_request(*inst.arguments) == (ids[:1], ids[1:])


def test_verbmem_reference_is_muses_cut(lm):
    """metrics/verbmem.py: gt encoded with special tokens, its first max_new_tokens ids, decoded without them."""
    tok = lm.tokenizer
    gt = " ".join(r["text"] for r in fixture_rows("news")[("raw", "forget")])
    gt_ids = tok(gt, return_tensors="pt", add_special_tokens=True).input_ids[:, :128]
    reference = tok.batch_decode(gt_ids, skip_special_tokens=True, clean_up_tokenization_spaces=True)[0]
    ours = muse_prompts.verbmem_reference(gt, tok, 128)
    assert ours == reference and len(ours) < len(gt.strip())


def test_knowmem_cut_is_muses():
    def muse_cut(string, words):   # metrics/knowmem.py get_prefix_before_words_occur
        for word in words:
            string = string.split(word)[0]
        return string

    for text in ["Ada Quill\n\nQuestion: x", "Ada\nQuestion", "Pim Question: who", "plain", "a\n\nb\nQuestion"]:
        assert muse_prompts.cut_at_stops(text) == muse_cut(text, ["\n\n", "\nQuestion", "Question:"])


# ------------------------------------------------------------------------------------------- scorers vs MUSE

OUTPUTS = [  # (gt, model output): fixed outputs the scorers are checked on
    ("Mira Kestrel", "Mira Kestrel"),
    ("Mira Kestrel", "It was Kestrel, Mira."),
    ("Tobin Ashgrove opened the copper bridge in 1990.", "The bridge was opened by Tobin in 1990"),
    ("a floating library", "nothing at all"),
    ("Lena's ferries, the river's pride", "lena s ferries the rivers pride"),
]


def _muse_rouge(gt, output):
    """metrics/logger.py RougeEvalLogger.log: RougeScorer(rouge1/2/L/Lsum, use_stemmer=False).score(gt, output)."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(rouge_types=["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=False)
    score = scorer.score(gt, output)
    return score["rougeL"].fmeasure, score["rougeL"].recall


class _Task:
    """The scoring side of a MUSE task, without lm-eval building it."""

    def __init__(self, muse_set, corpus="news", **metadata):
        self.config = type("C", (), {"dataset_kwargs": {"muse_set": muse_set, "muse_corpus": corpus},
                                     "metadata": metadata, "task": f"muse_{corpus}_{muse_set}"})()

    def process_results(self, doc, results):
        return muse_utils.MUSETask.process_results(self, doc, results)

    _muse_set = muse_utils.MUSETask._muse_set
    _corpus = muse_utils.MUSETask._corpus
    _tokenizer_name = muse_utils.MUSETask._tokenizer_name
    retrain_auc = muse_utils.MUSETask.retrain_auc


def test_knowmem_scores_are_muses():
    """eval.py knowmem_f / knowmem_r: agg['mean_rougeL'] * 100 (ROUGE-L F1); the recall beside it."""
    task = _Task("knowmem_f")
    items = [task.process_results({"gt": gt}, [out + "\n\nQuestion: next"]) for gt, out in OUTPUTS]
    f1 = muse_utils.percent_mean([i["rougeL_f1"] for i in items])
    recall = muse_utils.percent_mean([i["rougeL_recall"] for i in items])
    reference = [_muse_rouge(gt, out) for gt, out in OUTPUTS]
    assert f1 == pytest.approx(sum(r[0] for r in reference) / len(reference) * 100, abs=1e-12)
    assert recall == pytest.approx(sum(r[1] for r in reference) / len(reference) * 100, abs=1e-12)
    assert f1 != pytest.approx(recall)   # the fixed outputs tell F1 from recall


def test_verbmem_scores_are_muses(lm, monkeypatch):
    """eval.py verbmem_f: agg['mean_rougeL'] * 100 against gt cut to 128 tokens (metrics/verbmem.py)."""
    monkeypatch.setattr(muse_utils, "_tokenizer", lambda name: lm.tokenizer)
    task = _Task("verbmem_f", muse_tokenizer="the-tokenizer")
    long_gt = " ".join(r["text"] for r in fixture_rows("books")[("raw", "forget")])
    cases = OUTPUTS + [(long_gt, long_gt)]
    items = [task.process_results({"gt": gt}, [out]) for gt, out in cases]
    tok = lm.tokenizer
    reference = []
    for gt, out in cases:
        gt_ids = tok(gt, return_tensors="pt", add_special_tokens=True).input_ids[:, :128]
        gt_short = tok.batch_decode(gt_ids, skip_special_tokens=True, clean_up_tokenization_spaces=True)[0]
        reference.append(_muse_rouge(gt_short, out)[0])
    assert muse_utils.percent_mean([i["rougeL_f1"] for i in items]) == pytest.approx(np.mean(reference) * 100)
    assert items[-1]["rougeL_f1"] < 1.0   # the whole passage against its first 128 tokens: the cut shows


def test_verbmem_without_a_tokenizer_names_the_metadata_key():
    with pytest.raises(ValueError, match="muse_tokenizer"):
        _Task("verbmem_f").process_results({"gt": "x"}, ["y"])


def _muse_min_k(all_prob, ratio=0.4):
    """metrics/privleak.py inference: -mean of the lowest int(n * ratio) log-probs."""
    k_length = int(len(all_prob) * ratio)
    return float(-np.mean(np.sort(all_prob)[:k_length]).item())


def _muse_auc(forget, holdout):
    """metrics/privleak.py eval/sweep: nonmember = forget (0), member = holdout (1), roc_curve(y, -ppl)."""
    from sklearn.metrics import auc as get_auc
    from sklearn.metrics import roc_curve

    ppl = np.array(forget + holdout)
    y = np.array([0] * len(forget) + [1] * len(holdout))
    fpr, tpr, _ = roc_curve(y, -ppl)
    return get_auc(fpr, tpr)


def _result(logprobs):
    n = len(logprobs)
    return LoglikelihoodResult(float(sum(logprobs)), False, list(logprobs), [0.0] * n, [1.0] * n, [False] * n)


@pytest.mark.parametrize("corpus", muse_data.CORPORA)
def test_privleak_is_muses(corpus):
    """eval.py privleak: (auc['forget_holdout_Min-40%'] - AUC_RETRAIN) / AUC_RETRAIN * 100."""
    rng = np.random.default_rng(3)
    forget = [list(-rng.gamma(1.0, 0.5, size=n)) for n in (12, 30, 7, 18, 25)]
    holdout = [list(-rng.gamma(1.0, 1.5, size=n)) for n in (15, 9, 22, 30)]
    forget.append(list(holdout[0]))   # a tie
    task = _Task("privleak", corpus)
    items = [task.process_results({"member": False}, [_result(lp)])["auc"] for lp in forget]
    items += [task.process_results({"member": True}, [_result(lp)])["auc"] for lp in holdout]
    auc = _muse_auc([_muse_min_k(lp) for lp in forget], [_muse_min_k(lp) for lp in holdout])
    assert muse_utils.auc(items) == pytest.approx(auc, abs=1e-12)
    retrain = {"news": 0.47719999999999996, "books": 0.5392999999999999}[corpus]   # constants.py AUC_RETRAIN
    assert muse_utils.privleak(items) == pytest.approx((auc - retrain) / retrain * 100, abs=1e-9)
    ours = _Task("privleak", corpus, muse_retrain_auc=0.6)
    items = [ours.process_results({"member": i["member"]}, [_result(lp)])["privleak"]
             for i, lp in zip(items, forget + holdout)]
    assert muse_utils.privleak(items) == pytest.approx((auc - 0.6) / 0.6 * 100, abs=1e-9)
    with pytest.raises(ValueError, match="muse_retrain_auc"):
        _Task("privleak", corpus, muse_retrain_auc=1.5).process_results({"member": True}, [_result([-1.0, -2.0])])


def test_min_k_short_text_keeps_one_token():
    """M1: MUSE's Min-40% of a 2-token text is an empty mean (NaN); one token is kept here."""
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        assert math.isnan(_muse_min_k([-1.0, -3.0]))
    assert muse_metrics.min_k_prob([-1.0, -3.0]) == 3.0
    assert muse_metrics.min_k_prob([-1.0, -3.0, -2.0, -0.5, -4.0]) == _muse_min_k([-1.0, -3.0, -2.0, -0.5, -4.0])


def test_privleak_needs_both_sets():
    items = [{"member": False, "score": 1.0, "retrain_auc": 0.5}]
    with pytest.raises(ValueError, match="forget and holdout"):
        muse_utils.auc(items)


# --------------------------------------------------------------------------------------------- lm-eval, end to end

def test_task_folder_is_registered_with_lm_eval():
    """The `muse` entry point of `lm_eval.tasks` puts the package's task folder beside the project's."""
    from lm_eval.tasks import TaskManager

    from cru_harness.lmeval.registration import tasks_dir as project_tasks, with_project_tasks

    paths = with_project_tasks(None)
    assert paths[0] == project_tasks() and Path(tasks_dir()).is_relative_to(paths[0])
    names = set(TaskManager(include_path=paths, include_defaults=False).all_tasks)
    assert set(MUSE_TASKS) | {"muse", "muse_news", "muse_books", "tofu_forget10", "rwku_qa"} <= names


@pytest.mark.slow
def test_muse_tasks_run_through_lm_eval(muse_dir):
    """The tiny model on the fixture through lm-eval's Python API: every MUSE criterion comes out, as MUSE computes
    it from the logged outputs."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from cru_harness.testbed.names import resolve_model_path

    path = resolve_model_path("zoo:llama:finetuned")
    tasks = ["muse_news_verbmem_f", "muse_news_knowmem_f", "muse_news_knowmem_r", "muse_news_privleak",
             "muse_books_knowmem_f"]
    out = simple_evaluate(model="cru", model_args=f"pretrained={path}", tasks=tasks,
                          task_manager=TaskManager(metadata={"data_dir": str(muse_dir), "muse_tokenizer": path}),
                          device="cpu",
                          batch_size=8, log_samples=True, bootstrap_iters=0, limit=4,
                          gen_kwargs="max_gen_toks=16")
    results = out["results"]
    for task in tasks:
        for metric in (("auc", "privleak") if task.endswith("privleak") else ("rougeL_f1", "rougeL_recall")):
            assert math.isfinite(results[task][f"{metric},none"]), (task, metric)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    samples = out["samples"]["muse_news_verbmem_f"]
    reference = []
    for s in samples:
        gt_ids = tok(s["doc"]["gt"], return_tensors="pt", add_special_tokens=True).input_ids[:, :128]
        gt_short = tok.batch_decode(gt_ids, skip_special_tokens=True, clean_up_tokenization_spaces=True)[0]
        reference.append(_muse_rouge(gt_short, s["resps"][0][0])[0])
    assert results["muse_news_verbmem_f"]["rougeL_f1,none"] == pytest.approx(np.mean(reference) * 100)
    privleak = results["muse_news_privleak"]
    assert privleak["privleak,none"] == pytest.approx(
        (privleak["auc,none"] - muse_metrics.MUSE_RETRAIN_AUC["news"]) / muse_metrics.MUSE_RETRAIN_AUC["news"] * 100)
