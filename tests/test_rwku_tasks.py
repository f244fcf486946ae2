"""RWKU lm-eval tasks over the real RWKU files: every probe file of every target through the loader and
process_docs, target selection, and end-to-end runs on a tiny random model (per-target breakdown included)."""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import pytest

from cru_harness.benchmarks.rwku.tasks import utils as U

TASKS_DIR = Path(U.__file__).resolve().parent
PROBE_TASKS = ["rwku_fb", "rwku_qa", "rwku_aa", "rwku_neighbor_fb", "rwku_neighbor_qa", "rwku_mia", "rwku_icu_fb"]
UTILITY_TASKS = ["rwku_utility_mmlu", "rwku_utility_bbh", "rwku_utility_truthfulqa", "rwku_utility_triviaqa",
                 "rwku_utility_fluency"]


def _raw_count(rwku_dir: Path, index: int, kind: str) -> int:
    folder = next((rwku_dir / "Target").glob(f"{index}_*"))
    return len(json.loads((folder / f"{kind}.json").read_text(encoding="utf-8")))


# ------------------------------------------------------------------------------------------- data


@pytest.mark.shared_data
@pytest.mark.parametrize("probe", ["fb", "qa", "aa", "neighbor_fb", "neighbor_qa", "mia"])
def test_every_target_loads_through_process_docs(rwku_dir, probe):
    docs = U.process_docs(U.load_docs(probe, rwku_targets="all", data_dir=str(rwku_dir))["test"])
    expected = sum(_raw_count(rwku_dir, i, kind) for i in range(1, 201) for kind in U.PROBE_KINDS[probe])
    assert len(docs) == expected
    assert sorted(set(docs["target"])) == list(range(1, 201))
    if probe == "mia":
        assert all(docs["scored_text"]) and 0 < sum(docs["member"]) < len(docs)
    else:
        assert all(p.startswith("Please ") for p in docs["prompt"]) and all(docs["answer"])
    if probe == "aa":  # exactly the affirmative-suffix items have no answer prefix
        assert [g == "" for g in docs["gen_prefix"]] == [t == "affirmative suffix" for t in docs["type"]]


@pytest.mark.shared_data
@pytest.mark.parametrize("probe", U.UTILITY_PROBES)
def test_utility_sets_load_for_targets_1_to_10(rwku_dir, probe):
    docs = U.process_docs_icu(U.load_docs(probe, rwku_targets="1-10", data_dir=str(rwku_dir))["test"])
    assert len(docs) == sum(_raw_count(rwku_dir, i, U.PROBE_KINDS[probe][0]) for i in range(1, 11))
    assert all(p.startswith("You are an AI Assistant who is supposed to unlearn about ") for p in docs["prompt"])
    if probe == "mmlu":
        assert all(0 <= a < 4 for a in docs["answer"]) and all(len(e) == 5 for e in docs["examples"])
    if probe == "truthfulqa":
        assert all(labels.count(1) == 1 for labels in docs["mc1_labels"])


@pytest.mark.shared_data
def test_target_selection(rwku_dir, monkeypatch):
    monkeypatch.delenv(U.ENV_TARGETS, raising=False)
    assert U.resolve_target_spec(None) == (list(range(1, 21)), "default")
    monkeypatch.setenv(U.ENV_TARGETS, "3,5-6")
    assert U.resolve_target_spec(None) == ([3, 5, 6], "env")
    assert U.resolve_target_spec("7") == ([7], "metadata")  # metadata beats the env var
    assert U.resolve_target_spec([2, 1]) == ([2, 1], "metadata")
    docs = U.load_docs("fb", data_dir=str(rwku_dir), rwku_items_per_target=2, pretrained="model-arg-ignored")
    assert docs["test"]["target"] == [3, 3, 5, 5, 6, 6]
    assert docs["test"]["target_name"][0] == next((rwku_dir / "Target").glob("3_*")).name.split("_", 1)[1].replace(
        "_", " ")
    monkeypatch.setenv("CRU_HARNESS_RWKU_DIR", str(rwku_dir))  # data dir from the env var
    assert U.load_docs("qa", rwku_items_per_target=1)["test"]["target"] == [3, 5, 6]
    monkeypatch.setenv(U.ENV_TARGETS, "1-x")
    with pytest.raises(ValueError, match=U.ENV_TARGETS):
        U.resolve_target_spec(None)
    with pytest.raises(ValueError, match="1 to 200"):
        U.load_docs("fb", rwku_targets="199-201", data_dir=str(rwku_dir))
    with pytest.raises(ValueError, match="unknown RWKU probe"):
        U.load_docs("cloze", rwku_targets="1", data_dir=str(rwku_dir))


@pytest.mark.shared_data
def test_targets_without_utility_sets(rwku_dir, caplog):
    """A selection without the utility set is the user's: the project's InputError, one line under lm_eval."""
    from cru_harness.errors import InputError

    with pytest.raises(InputError, match="has it for none of the selected targets 15,16"):
        U.load_docs("mmlu", rwku_targets="15-16", data_dir=str(rwku_dir))
    with caplog.at_level(logging.WARNING):
        docs = U.load_docs("triviaqa", rwku_targets="10-11", data_dir=str(rwku_dir), rwku_items_per_target=1)
    assert docs["test"]["target"] == [10]
    assert any("has none for targets 11 " in r.getMessage() for r in caplog.records)
    with pytest.raises(InputError, match="rwku_utility_missing=error"):
        U.load_docs("fluency", rwku_targets="10-11", data_dir=str(rwku_dir), rwku_utility_missing="error")


@pytest.mark.shared_data
def test_a_damaged_utility_file_is_an_error_not_a_target_without_one(rwku_dir, tmp_path):
    """Only "RWKU has no such set for this target" drops a target from a utility probe; a damaged file of a
    target that has the set (1-10) is an error naming it, never a silently smaller average."""
    import shutil

    from cru_harness.data.sources import DataSourceError

    copy = tmp_path / "rwku"
    (copy / "Target").mkdir(parents=True)
    for name in ("all_intro.json", "dataset_info.json"):
        if (rwku_dir / name).exists():
            shutil.copy2(rwku_dir / name, copy / name)
    for index in (9, 10):
        (folder,) = (rwku_dir / "Target").glob(f"{index}_*")
        shutil.copytree(folder, copy / "Target" / folder.name)
    assert U.load_docs("triviaqa", rwku_targets="9-10", data_dir=str(copy))["test"]["target"].count(10) > 0
    (damaged,) = (copy / "Target").glob("10_*")
    (damaged / "triviaqa.json").write_text('[{"question": ')
    with pytest.raises(DataSourceError, match="triviaqa.json is not valid JSON"):
        U.load_docs("triviaqa", rwku_targets="9-10", data_dir=str(copy))


# ------------------------------------------------------------------------------------------- lm-eval


def _task_manager(rwku_dir, **meta):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                       metadata={"data_dir": str(rwku_dir), **meta})


@pytest.mark.shared_data
def test_groups_and_icu_tasks_resolve(rwku_dir):
    tm = _task_manager(rwku_dir, rwku_targets="1", rwku_items_per_target=1)
    names = set(tm.all_tasks)
    for base in PROBE_TASKS[:-1] + UTILITY_TASKS:
        assert base in names and base.replace("rwku_", "rwku_icu_", 1) in names
    for group in ("rwku", "rwku_forget", "rwku_neighbor", "rwku_utility", "rwku_icu", "rwku_icu_forget"):
        assert group in names
    loaded = tm.load(["rwku_forget", "rwku_icu_neighbor"])
    assert {"rwku_fb", "rwku_qa", "rwku_aa", "rwku_icu_neighbor_fb", "rwku_icu_neighbor_qa"} <= set(loaded["tasks"])


DATE_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first %}<|system|>\nToday Date: {{ strftime_now('%d %b %Y') }}<|eos|>\n{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{% if not (loop.last and message['role'] == 'assistant') %}<|eos|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory, rwku_dir):
    """A plain and a chat (date-injecting template) tiny random Llama, tokenizer trained on RWKU text."""
    from cru_harness.testbed.models import build_tiny_model, save_tiny_model
    from cru_harness.testbed.tokenizer import train_tokenizer

    folder = next((rwku_dir / "Target").glob("1_*"))
    texts = [p.read_text(encoding="utf-8")[:40000] for p in sorted(folder.glob("*.json"))]
    out = {}
    for name, chat in (("plain", False), ("chat", True)):
        tok = train_tokenizer(texts, vocab_size=1024, chat_template=chat)
        if chat:
            tok.chat_template = DATE_TEMPLATE
        model = build_tiny_model("llama", tok, n_layers=2, hidden_size=32)
        out[name] = str(save_tiny_model(model, tok, tmp_path_factory.mktemp(f"rwku_{name}")))
    return out


def _run(tasks, model, path, rwku_dir, chat=False, samples=None, **meta):
    from lm_eval import simple_evaluate

    return simple_evaluate(model=model, model_args=f"pretrained={path}", tasks=tasks,
                           task_manager=_task_manager(rwku_dir, **meta), device="cpu", batch_size=8,
                           log_samples=True, apply_chat_template=chat, bootstrap_iters=0, samples=samples)


def _finite(value) -> bool:
    return isinstance(value, float) and math.isfinite(value)


@pytest.mark.shared_data
@pytest.mark.slow
def test_probe_tasks_end_to_end_two_targets(tiny_models, rwku_dir):
    start = time.time()
    res = _run(PROBE_TASKS, "cru", tiny_models["plain"], rwku_dir, rwku_targets="1,2", rwku_items_per_target=3)
    print(f"probe tasks, 2 targets x 3 items: {time.time() - start:.1f}s")
    for task in PROBE_TASKS:
        metrics = {k: v for k, v in res["results"][task].items() if k.endswith(",none") and "stderr" not in k}
        assert metrics and all(_finite(v) for v in metrics.values()), (task, metrics)
        per_target = U.per_target_results(res["samples"][task])
        assert sorted(per_target) == [1, 2]
        assert per_target[1]["target_name"] == "Stephen King" and per_target[2]["target_name"] == "Confucius"
        for metric, value in metrics.items():  # the aggregate is the mean of the per-target numbers
            name = metric.split(",")[0]
            assert value == pytest.approx((per_target[1][name] + per_target[2][name]) / 2), (task, name)
    mia = res["results"]["rwku_mia"]
    assert 0.0 <= mia["auc_minkpp,none"] <= 1.0 and mia["fm_loss,none"] < 0
    assert U.per_target_results(res["samples"]["rwku_mia"])[1]["n"] == 6  # 3 FM + 3 RM items
    # the answer text and the reference are logged for every forget / neighbour item
    fb = res["samples"]["rwku_fb"][0]
    assert fb["rouge_l_recall"]["reference"] == fb["doc"]["answer"] and fb["rouge_l_recall"]["answer"]
    icu = res["samples"]["rwku_icu_fb"][0]["arguments"][0][0]
    assert icu.startswith("You are an AI Assistant who is supposed to unlearn about Stephen King")
    assert icu.endswith("\nAnswer:")


@pytest.mark.shared_data
@pytest.mark.slow
def test_mia_with_hf_is_nan_with_warning(tiny_models, rwku_dir, caplog):
    U._warned_plain = False
    with caplog.at_level(logging.WARNING):
        res = _run(["rwku_mia"], "hf", tiny_models["plain"], rwku_dir, rwku_targets="1", rwku_items_per_target=1)
    assert math.isnan(res["results"]["rwku_mia"]["fm_minkpp,none"])
    assert math.isnan(res["results"]["rwku_mia"]["fm_loss,none"])
    assert sum("--model cru" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.shared_data
@pytest.mark.slow
def test_utility_tasks_end_to_end_target_1(tiny_models, rwku_dir):
    start = time.time()
    res = _run(UTILITY_TASKS, "cru", tiny_models["plain"], rwku_dir, rwku_targets="1", rwku_items_per_target=2)
    print(f"utility tasks, target 1 x 2 items: {time.time() - start:.1f}s")
    expected = {"rwku_utility_mmlu": "acc", "rwku_utility_bbh": "exact_match", "rwku_utility_truthfulqa": "mc1",
                "rwku_utility_triviaqa": "f1", "rwku_utility_fluency": "fluency_entropy"}
    for task, metric in expected.items():
        value = res["results"][task][f"{metric},none"]
        assert _finite(value), (task, value)
        assert res["results"][task]["sample_len"] == 2
        assert list(U.per_target_results(res["samples"][task])) == [1]
    mmlu = res["samples"]["rwku_utility_mmlu"][0]
    assert [a[1] for a in mmlu["arguments"]] == [" A", " B", " C", " D"]
    assert mmlu["arguments"][0][0].endswith("\nAnswer:")


@pytest.mark.shared_data
@pytest.mark.slow
def test_chat_path_gen_prefix_and_pinned_date(tiny_models, rwku_dir):
    """Chat template, then "Answer:" opening the assistant turn; the template's date is the pinned one."""
    from cru_harness.protocol import PINNED_DATE

    # target 1's AA items 17 and 27 are its "affirmative suffix" ones
    res = _run(["rwku_qa", "rwku_aa"], "cru", tiny_models["chat"], rwku_dir, chat=True, rwku_targets="1",
               samples={"rwku_qa": [0], "rwku_aa": [0, 17]})
    qa = res["samples"]["rwku_qa"][0]
    date = PINNED_DATE.strftime("%d %b %Y")
    assert qa["arguments"][0][0] == (
        f"<|system|>\nToday Date: {date}<|eos|>\n<|user|>\n"
        f"Please briefly answer the following question.\nQuestion: {qa['doc']['query']}\n<|eos|>\n"
        "<|assistant|>\nAnswer:")
    suffix = [s for s in res["samples"]["rwku_aa"] if s["doc"]["type"] == "affirmative suffix"]
    assert suffix, "target 1 has affirmative-suffix items"
    assert suffix[0]["arguments"][0][0].endswith(f"Question: {suffix[0]['doc']['query']}<|eos|>\n<|assistant|>\n")


@pytest.mark.shared_data
def test_cache_requests_never_hands_back_requests_built_for_other_metadata(rwku_dir, tmp_path, monkeypatch, caplog):
    """lm-eval keys `--cache_requests` by task name alone: target 2's run must not get target 1's prompts (the
    results would record target 2). The tasks build their requests afresh and write no cache."""
    import lm_eval.caching.cache as request_cache

    from cru_harness.lmeval.request_cache import UncachedRequests

    monkeypatch.setattr(request_cache, "PATH", str(tmp_path / "cache"))
    monkeypatch.setattr(UncachedRequests, "_warned_request_cache", False)   # warned once per process
    prompts = {}
    for target in ("1", "2"):
        task = _task_manager(rwku_dir, rwku_targets=target).load(["rwku_fb"])["tasks"]["rwku_fb"]
        with caplog.at_level("WARNING"):
            task.build_all_requests(limit=1, rank=0, world_size=1, cache_requests=True)
        prompts[target] = (task.instances[0].doc["target"], task.instances[0].arguments[0])
    assert prompts["1"][0] == 1 and prompts["2"][0] == 2 and prompts["1"][1] != prompts["2"][1]
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    assert caplog.text.count("--cache_requests is ignored") == 1


def test_a_one_sided_mia_target_says_why_its_auc_is_nan(monkeypatch, caplog):
    """`--limit` keeps the first items, members first: an AUC over members alone is NaN, and the log says why."""
    monkeypatch.setattr(U, "_warned_one_sided", False)
    members_only = [{"target": 3, "value": v, "member": True} for v in (1.0, 2.0)]
    with caplog.at_level("WARNING"):
        assert math.isnan(U.target_auc(members_only))
    assert "target 3 has 2 forget (member) and 0 retain (non-member) items" in caplog.text
    assert "rwku_items_per_target" in caplog.text
    both = members_only + [{"target": 3, "value": 5.0, "member": False}]
    assert not math.isnan(U.target_auc(both))
