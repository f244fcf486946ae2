"""MUSE's training blocks against its baselines' dataset (swj0419/muse_bench at fcd6651, baselines/baselines/dataset.py
`DefaultDataset` on the `.txt` that load_data.py writes), on fictitious text.
"""
from __future__ import annotations

import pytest

from cru_harness.benchmarks.muse import training as muse_training

from muse_fixture import fixture_rows


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


def test_text_pieces_cover_the_joined_text_at_whitespace():
    texts = ["alpha beta gamma delta", "epsilon zeta eta theta iota"]
    pieces = muse_training.text_pieces(texts, max_chars=12)
    assert "".join(pieces) == muse_training.muse_text(texts)   # nothing lost, nothing added
    assert all(len(p) <= 12 for p in pieces)
    assert pieces[:2] == ["alpha beta ", "gamma delta\n"]    # cut after whitespace, never inside a word here
    assert muse_training.text_pieces(["x" * 25], max_chars=10) == ["x" * 10, "x" * 10, "x" * 5]   # one long word
    assert muse_training.text_pieces(["short"]) == ["short"]


def test_corpus_rows_serve_the_whole_split_in_pieces(tmp_path):
    """A MUSE training corpus is the split's joined text in pieces: every character trained on, however long a text
    (a Books text is a whole book), where one row per text would be cut at max_length."""
    from cru_harness.benchmarks.muse import data as muse_data
    from cru_harness.benchmarks.muse.plugin import BENCHMARK

    from muse_fixture import write_muse_fixture

    root = write_muse_fixture(tmp_path / "muse")
    texts = muse_data.load_texts("news", "raw", "forget", root)
    rows, origin = BENCHMARK.corpus_rows("muse:news:forget", root)
    assert "".join(r["text"] for r in rows) == "\n\n".join(texts) and "news raw/forget" in origin
    assert BENCHMARK.corpus_rows("tofu:forget01", root) is None
    # a book-length text (invented): many pieces, all of it kept
    book = " ".join(f"Chapter {i}: the lantern keeper of Duskford walked to the tide clock again." for i in range(600))
    folder = tmp_path / "long" / "books" / "raw"
    folder.mkdir(parents=True)
    (folder / "forget.json").write_text(__import__("json").dumps([book, book[:5000]]), encoding="utf-8")
    long_rows, _ = BENCHMARK.corpus_rows("muse:books:forget", tmp_path / "long")
    assert len(long_rows) > 5 and all(len(r["text"]) <= muse_training.PIECE_CHARS for r in long_rows)
    assert "".join(r["text"] for r in long_rows) == book + "\n\n" + book[:5000]
