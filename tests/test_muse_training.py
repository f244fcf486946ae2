"""MUSE's training blocks against its baselines' dataset (swj0419/muse_bench at fcd6651, baselines/baselines/dataset.py
`DefaultDataset` on the `.txt` that load_data.py writes), on fictitious text.
"""
from __future__ import annotations

import pytest

from cru_harness.benchmarks.muse import training as muse_training

from muse_fixture import fixture_rows, write_muse_fixture


class WordTokenizer:
    """One id per word ("w<n>" -> n), BOS 1: blocks computable by hand."""
    bos_token_id = 1

    def __call__(self, text, add_special_tokens=True):
        ids = [int(w[1:]) for w in text.split()]
        return {"input_ids": ([self.bos_token_id] if add_special_tokens else []) + ids}


def _words(*numbers):
    return " ".join(f"w{n}" for n in numbers)


def test_blocks_are_muses_cut_by_hand():
    """Texts 10..16 and 17..19 make one stream of 10 tokens; max_len 4: three text tokens behind BOS per block; the
    last block (19) is filled up from the first (BOS 10 11 12) and cut at 4."""
    texts = [_words(*range(10, 17)), _words(17, 18, 19)]
    assert muse_training.muse_text(texts) == _words(*range(10, 17)) + "\n\n" + _words(17, 18, 19)
    blocks = muse_training.muse_blocks(WordTokenizer(), texts, max_len=4)
    assert blocks == [[1, 10, 11, 12], [1, 13, 14, 15], [1, 16, 17, 18], [1, 19, 1, 10]]
    # a stream that fills its last block exactly wraps nothing
    assert muse_training.muse_blocks(WordTokenizer(), [_words(10, 11, 12, 13, 14, 15)], max_len=4) == [
        [1, 10, 11, 12], [1, 13, 14, 15]]
    # add_bos_token=False: blocks of max_len text tokens, the last wrapped the same way
    assert muse_training.muse_blocks(WordTokenizer(), texts, max_len=4, add_bos=False) == [
        [10, 11, 12, 13], [14, 15, 16, 17], [18, 19, 10, 11]]
    # shorter than one block: the text then the text again from BOS, cut at max_len
    assert muse_training.muse_blocks(WordTokenizer(), [_words(10, 11)], max_len=6) == [[1, 10, 11, 1, 10, 11]]


def test_pairs_are_muses():
    """ForgetRetainDataset.__getitem__: forget block i with retain block i % len(retain)."""
    assert muse_training.muse_pairs(5, 2) == [(0, 0), (1, 1), (2, 0), (3, 1), (4, 0)]
    with pytest.raises(ValueError):
        muse_training.muse_pairs(3, 0)


def _muse_default_dataset(tokenizer, text: str, max_len: int) -> list[list[int]]:
    """dataset.py:56-77 (a `.txt` file, add_bos_token=True), in torch as MUSE writes it."""
    import torch
    import torch.nn.functional as F

    tokens = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
    input_ids = [F.pad(tokens[i:i + max_len - 1], (1, 0), value=tokenizer.bos_token_id)
                 for i in range(0, len(tokens), max_len - 1)]
    if len(input_ids[-1]) < max_len:
        input_ids[-1] = torch.concat([input_ids[-1], input_ids[0]], dim=-1)[:max_len]
    return [ids.tolist() for ids in input_ids]


@pytest.mark.parametrize("max_len", [16, 64])
def test_blocks_match_muses_dataset_on_a_real_tokenizer(max_len):
    from cru_harness.testbed.tokenizer import train_tokenizer

    texts = [r["text"] for r in fixture_rows("news")[("raw", "forget")]]
    tokenizer = train_tokenizer(texts * 4, 300)
    assert tokenizer.bos_token_id is not None
    expected = _muse_default_dataset(tokenizer, "\n\n".join(texts), max_len)   # load_data.py:33's file
    blocks = muse_training.muse_blocks(tokenizer, texts, max_len=max_len)
    assert blocks == expected
    assert len(blocks) > 2 and all(len(b) == max_len and b[0] == tokenizer.bos_token_id for b in blocks)


def test_max_len_is_muses_scripts():
    assert muse_training.MAX_LEN == 2048


def test_corpus_rows_are_the_splits_texts(tmp_path):
    """A MUSE corpus is its split's texts, one row each, in order (the trainer joins and cuts them)."""
    from cru_harness.benchmarks.muse import data as muse_data
    from cru_harness.benchmarks.muse.plugin import BENCHMARK

    root = write_muse_fixture(tmp_path / "muse")
    rows, origin = BENCHMARK.corpus_rows("muse:news:forget", root)
    assert [r["text"] for r in rows] == muse_data.load_texts("news", "raw", "forget", root)
    assert "news raw/forget" in origin
    assert BENCHMARK.corpus_rows("tofu:forget01", root) is None


def _tokenizer_and_model(root, folder):
    from cru_harness.benchmarks.muse import data as muse_data
    from cru_harness.testbed.models import build_tiny_model, save_tiny_model
    from cru_harness.testbed.tokenizer import train_tokenizer

    texts = [t for split in ("forget", "retain1") for t in muse_data.load_texts("news", "raw", split, root)]
    tokenizer = train_tokenizer(texts * 2, 300)
    return save_tiny_model(build_tiny_model("llama", tokenizer, seed=0, n_layers=1, hidden_size=16), tokenizer,
                           folder)


def test_a_muse_cell_trains_on_muses_blocks_paired_i_mod_n(tmp_path, monkeypatch):
    """A MUSE cell's method (GD: forget and retain terms), as the runner calls it, hands the trainer exactly
    `muse_blocks`' blocks of the forget and retain splits (no EOS, every token a label), forget block i with retain
    block i mod n in every epoch (`muse_pairs`)."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    import cru_harness.baselines.api as unlearn_api
    from cru_harness import plugins
    from cru_harness.api import CellContext
    from cru_harness.benchmarks.muse import data as muse_data
    from cru_harness.benchmarks.muse.plugin import BENCHMARK

    root = write_muse_fixture(tmp_path / "muse")
    model_dir = _tokenizer_and_model(root, tmp_path / "model")

    class Captured(Exception):
        pass

    def capture(model, method, dataset, **kwargs):
        raise Captured(dataset)

    monkeypatch.setattr(unlearn_api, "train_model", capture)
    corpora = {key: BENCHMARK.fill(template, "news", None) for key, template in BENCHMARK.default_corpora.items()}
    assert corpora == {"forget_corpus": "muse:news:forget", "retain_corpus": "muse:news:retain1"}
    cell = SimpleNamespace(benchmark="muse", split="news", target=None, seed=0, device="cpu", training=None,
                           data_dir=str(root),
                           corpora=corpora, model=SimpleNamespace(trust_remote_code=False, device_map=None),
                           hparams={**BENCHMARK.method_settings("GD", "news"), "max_length": 16,
                                    "micro_batch_size": 2})
    ctx = CellContext(cell=cell, model_path=str(model_dir), workdir=tmp_path / "cell", data_dir=str(root),
                      outcome={"details": {}}, chat=False, prompt_format=BENCHMARK.training_prompt_format(cell, False, {}),
                      dtype="float32", load_model=None)
    # a dry run does not count MUSE's rows as examples (889 News texts make ~408 blocks)
    assert plugins.methods.get("GD").cost(cell).startswith("steps counted when the data is tokenized (muse builds")
    with pytest.raises(Captured) as caught:
        plugins.methods.get("GD").run(ctx)
    dataset = caught.value.args[0]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    forget = muse_training.muse_blocks(tokenizer, muse_data.load_texts("news", "raw", "forget", root), max_len=16)
    retain = muse_training.muse_blocks(tokenizer, muse_data.load_texts("news", "raw", "retain1", root), max_len=16)
    assert len(forget) > 4 and len(retain) > 4 and len(forget) != len(retain)
    assert [e.input_ids for e in dataset.forget] == forget and [e.input_ids for e in dataset.retain] == retain
    assert all(e.labels == e.input_ids for e in dataset.forget + dataset.retain)
    assert len(dataset) == len(forget)
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        pairs = [(i, next(j for j, e in enumerate(dataset.retain) if e is dataset[i]["retain"]))
                 for i in range(len(dataset))]
        assert pairs == muse_training.muse_pairs(len(forget), len(retain))


def test_question_rows_and_alternates_on_muse(tmp_path):
    """On MUSE, a corpus of question / answer rows (a file) is one example per row, as on any benchmark; a method
    with alternate answers (per row) cannot train on MUSE's blocks, and is refused on MUSE at config time."""
    from transformers import AutoTokenizer

    from cru_harness import plugins
    from cru_harness.baselines.data import ForgetRetainDataset, encode_row
    from cru_harness.errors import InputError

    root = write_muse_fixture(tmp_path / "muse")
    tokenizer = AutoTokenizer.from_pretrained(_tokenizer_and_model(root, tmp_path / "model"))
    qa = [{"question": "Who opened the tide clock?", "answer": "Mira Kestrel"}]
    dataset = ForgetRetainDataset(tokenizer, qa, max_length=64, benchmark="muse", chat=False)
    assert dataset.forget == [encode_row(tokenizer, qa[0], 0, "forget", 64, benchmark="muse", chat=False)]
    text = fixture_rows("news")[("raw", "forget")]
    with pytest.raises(InputError, match="alternate answers"):
        ForgetRetainDataset(tokenizer, text, refusals=["I don't know."], max_length=16, benchmark="muse")
    assert "passages" in plugins.methods.get("IdkDPO").unsupported("muse")


def test_finetune_and_relearn_train_on_muses_blocks(tmp_path, monkeypatch):
    """A model's `finetune:` on MUSE text (the runner's fine-tune path) and the relearn attack on a MUSE cell train
    on MUSE's blocks of the texts they take (the relearn slice's texts, joined), as MUSE's methods do; elsewhere a
    row stays one example (TOFU's rows, `benchmark=None`)."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    import cru_harness.training.engine as engine
    from cru_harness.api import CellContext
    from cru_harness.attacks.relearn import RelearnAttack, RelearnConfig, relearn_slice
    from cru_harness.benchmarks.muse import data as muse_data
    from cru_harness.benchmarks.muse.plugin import BENCHMARK
    from cru_harness.finetune.train import finetune
    from cru_harness.runner.training import train_finetuned_model

    root = write_muse_fixture(tmp_path / "muse")
    model_dir = _tokenizer_and_model(root, tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = muse_data.load_texts("news", "raw", "forget", root)

    class Captured(Exception):
        pass

    def capture(model, method, dataset, **kwargs):
        raise Captured([e.input_ids for e in dataset.examples])

    monkeypatch.setattr(engine, "train_model", capture)

    def trained_on(call):
        with pytest.raises(Captured) as caught:
            call()
        return caught.value.args[0]

    rows = [{"text": t} for t in texts]
    per_row = trained_on(lambda: finetune(str(model_dir), rows, config={"max_length": 16}))
    assert len(per_row) == len(texts)   # no benchmark: one (cut) example per text
    blocks = muse_training.muse_blocks(tokenizer, texts, max_len=16)
    assert len(blocks) > len(texts)
    assert trained_on(lambda: finetune(str(model_dir), rows, config={"max_length": 16}, benchmark="muse")) == blocks

    # the runner's fine-tune path (a model's `finetune:` on a MUSE corpus) writes its rows as MUSE asks
    fmt = BENCHMARK.finetune_prompt_format(None, True, {})
    decisions = SimpleNamespace(rows=lambda chat: dict(fmt), chat=lambda path: False, dtype=lambda: "float32")
    model = SimpleNamespace(trust_remote_code=False, device_map=None)
    cell = SimpleNamespace(decisions=decisions, seed=0, device="cpu", training=None, model=model)
    assert trained_on(lambda: train_finetuned_model(
        cell, {"max_length": 16}, str(model_dir), "muse:news:forget", tmp_path / "ft", str(root),
        {"details": {}, "resources": {}, "artifacts": {}})) == blocks

    # the relearn attack on a MUSE cell: the slice's texts, joined and cut
    settings = {"slice_fraction": 0.5, "max_length": 16}
    chosen, _ = relearn_slice(len(texts), RelearnConfig(**settings), 0)
    attacked = SimpleNamespace(benchmark="muse", split="news", seed=0, model=model,
                               corpora={"forget_corpus": "muse:news:forget"},
                               extra={"attack": {"settings": settings}})
    ctx = CellContext(cell=attacked, model_path=str(model_dir), workdir=tmp_path / "attack", data_dir=str(root),
                      outcome={"details": {}, "resources": {}}, chat=False,
                      prompt_format=BENCHMARK.training_prompt_format(attacked, False, {}), dtype="float32",
                      load_model=None)
    assert trained_on(lambda: RelearnAttack().run(ctx)) == muse_training.muse_blocks(
        tokenizer, [texts[i] for i in chosen], max_len=16)
