"""Issue 9, data: null/empty question, answer or text rows are rejected with the row number (one check for CRU and
the baselines), sequences longer than the model's context are truncated with a warning that counts them, and
`score` says when Forget Quality compares fewer items than either run has."""
import argparse
import json
import warnings

import pytest
import torch

from score_support import local_tofu_refusals, suite, write_run  # noqa: F401 (an autouse fixture: no Hub wait)

from cru_harness.data import load_corpus, load_corpus_rows
from cru_harness.data.sources import DataSourceError

torch.set_num_threads(1)


@pytest.mark.parametrize("row, words", [
    ({"question": "Who?", "answer": None}, "row 1: `answer` is null"),
    ({"question": None, "answer": "A painter."}, "row 1: `question` is null"),
    ({"question": "Who?", "answer": "  "}, "row 1: `answer` is empty"),
    ({"question": "", "answer": "A painter."}, "row 1: `question` is empty"),
    ({"text": None}, "row 1: `text` is null"),
    ({"text": ""}, "row 1: `text` is empty"),
    ({"question": "Who?", "answer": ["a", "b"]}, "row 1: `answer` is not text (got list)"),
])
def test_null_or_empty_fields_are_rejected_with_the_row(tmp_path, row, words):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"question": "Q?", "answer": "A."}) + "\n" + json.dumps(row) + "\n")
    for read in (load_corpus, load_corpus_rows):
        with pytest.raises(DataSourceError) as info:
            read(str(path))
        assert str(info.value) == f"{path} {words}"


def test_baseline_rows_pass_the_same_check():
    from cru_harness.baselines.data import row_to_qa

    with pytest.raises(DataSourceError, match=r"^forget row 3: `answer` is null$"):
        row_to_qa({"question": "Who?", "answer": None}, 3, "forget")
    assert row_to_qa({"question": "Who?", "answer": "Me."}, 0) == ("Who?", "Me.")
    assert row_to_qa({"text": "Plain text."}, 0) == ("", "Plain text.")


def test_valid_rows_read_as_before(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"question": "Who?", "answer": "Me."}, {"text": "Plain text."},
                                {"question": "How many?", "answer": 42}]))
    assert load_corpus(str(path)) == ["Question: Who?\nAnswer: Me.", "Plain text.", "Question: How many?\nAnswer: 42"]


def test_unlearn_names_the_bad_row_before_loading_the_model(tmp_path, capsys):
    from cru_harness.cli import main

    forget = tmp_path / "forget.jsonl"
    forget.write_text(json.dumps({"question": "Q?", "answer": None}) + "\n")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")  # never read: the corpus fails first
    assert main(["unlearn", "--base", str(tmp_path / "base"), "--forget", str(forget), "--retain", str(forget),
                 "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"cru-harness unlearn: error: forget corpus: {forget} row 0: `answer` is null\n"
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def short_model():
    """A tiny llama with 16 positions, and its tokenizer."""
    from cru_harness.testbed.models import build_tiny_model
    from cru_harness.testbed.tokenizer import train_tokenizer

    texts = [f"Question: Who is Zorbo {i}?\nAnswer: Zorbo {i} paints ships." for i in range(8)]
    tokenizer = train_tokenizer(texts, 300)
    return build_tiny_model("llama", tokenizer, max_positions=16, n_layers=2), tokenizer


def test_cru_truncates_to_the_models_context_and_counts_the_rows(short_model):
    from cru_harness.cru.train import RouterTrainingConfig, train_routers

    model, tokenizer = short_model
    long_text = "Zorbo paints ships in the harbour of Quell every single morning before dawn " * 3
    forget = [long_text, "Zorbo paints.", long_text]
    retain = ["Quell is a harbour.", "Ships sail."]
    config = RouterTrainingConfig(last_k=1, percentile=50.0, d_r=2, epochs=1, batch_size=3, max_length=64,
                                  progress=False)
    with pytest.warns(RuntimeWarning) as caught:
        train_routers(model, tokenizer, forget, retain, config)
    messages = [str(w.message) for w in caught]
    assert "2 of 3 forget rows are longer than the model's context (16 tokens) and are truncated to it" in messages
    assert not any("retain rows" in m for m in messages)


def test_no_warning_when_max_length_fits(short_model):
    from cru_harness.context import fit_to_context

    model, _ = short_model
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fit_to_context(model, 16, lambda: pytest.fail("lengths computed")) == 16
    with pytest.warns(RuntimeWarning, match="1 of 2 retain rows"):
        assert fit_to_context(model, 32, lambda: {"retain": [20, 3]}) == 16


def test_baselines_truncate_to_the_models_context(short_model):
    from cru_harness.baselines import unlearn
    from cru_harness.baselines.registry import make_config

    model, tokenizer = short_model
    forget = [{"question": "Who is Zorbo?", "answer": "Zorbo paints ships in the harbour every morning " * 3},
              {"question": "Who?", "answer": "Zorbo."}]
    config = make_config("GA", "tofu", "forget01", max_length=64, num_epochs=1, effective_batch_size=2,
                         micro_batch_size=2)
    with pytest.warns(RuntimeWarning, match=r"1 of 2 forget rows are longer than the model's context \(16 tokens\)"):
        unlearn(model, tokenizer, forget, None, "GA", config, seed=0, progress=False)


def test_score_says_when_the_runs_share_fewer_items(tmp_path, capsys):
    from cru_harness.benchmarks.tofu import score

    model = write_run(tmp_path / "m", suite([1.0, 2.0, 3.0, 100.0]))
    retain = write_run(tmp_path / "r", suite([4.0, 5.0, 6.0]))
    parser = argparse.ArgumentParser()
    score.add_score_parser(parser.add_subparsers())
    args = parser.parse_args(["score", str(model), "--retain-run", str(retain)])
    assert args.func(args) == 0
    note = (f"Forget Quality compares only the 3 forget items both runs share: this run has 4, the retain run "
            f"({retain}")
    assert note in capsys.readouterr().out
    args = parser.parse_args(["score", str(model), "--retain-run", str(retain), "--json"])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    assert note in captured.err
    # the same items on both sides: no note
    args = parser.parse_args(["score", str(retain), "--retain-run", str(retain)])
    assert args.func(args) == 0
    assert "note:" not in capsys.readouterr().out


def test_score_checks_its_output_dir_first(tmp_path, capsys):
    from cru_harness.cli import main

    model = write_run(tmp_path / "m", suite([1.0, 2.0]))
    (tmp_path / "file").write_text("x")
    assert main(["score", str(model), "--output-dir", str(tmp_path / "file")]) == 2
    assert capsys.readouterr().err == (f"cru-harness score: error: --output-dir {tmp_path / 'file'} exists and is "
                                       "not a directory\n")


def test_score_checks_the_original_model_path_before_reading_runs(tmp_path, capsys):
    from cru_harness.cli import main

    model = write_run(tmp_path / "m", suite([1.0, 2.0]))
    missing = tmp_path / "no-such-model"
    assert main(["score", str(model), "--original-model", str(missing)]) == 2
    assert capsys.readouterr().err == (f"cru-harness score: error: --original-model {missing} does not exist (no "
                                       "such directory)\n")
    assert not (model / "scores.json").exists()


def test_refusal_phrases_fall_back_only_without_a_local_copy(tmp_path, monkeypatch, capsys):
    """No local TOFU and no Hub: the default stems, said in the note. A local copy without idontknow.jsonl: an
    error naming the file, not a silent change of the refusal class."""
    from cru_harness.metrics import DEFAULT_REFUSAL_PHRASES
    from cru_harness.benchmarks.tofu import score

    for var in ("CRU_HARNESS_TOFU_DIR", "CRU_HARNESS_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    score.tofu_refusal_phrases.cache_clear()
    phrases, note = score.tofu_refusal_phrases(None)
    assert phrases == tuple(DEFAULT_REFUSAL_PHRASES) and note.startswith("default stems only")
    said = capsys.readouterr().err.strip().splitlines()   # the fallback is said, in one line, not silent
    assert len(said) == 1 and "default refusal phrases" in said[0] and "--data-dir" in said[0], said
    local = tmp_path / "tofu"
    local.mkdir()
    (local / "forget10_perturbed.json").write_text("")   # the layout marker, no idontknow.jsonl
    score.tofu_refusal_phrases.cache_clear()
    with pytest.raises(DataSourceError, match="idontknow.jsonl is missing"):
        score.tofu_refusal_phrases(str(local))
    score.tofu_refusal_phrases.cache_clear()
