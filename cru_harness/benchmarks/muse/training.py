"""MUSE's training examples: how its baselines cut the forget and retain text into blocks (swj0419/muse_bench at
fcd6651).

- `load_data.py:33` (and `:40` for scal / sust) writes a split's texts as one file, `"\\n\\n".join(texts)`.
- `baselines/baselines/dataset.py:56-77` (`DefaultDataset`, a `.txt` file, `add_bos_token=True`): the whole file is
  tokenized once without special tokens, cut into consecutive blocks of `max_len - 1` tokens, each with BOS in
  front; a last block shorter than `max_len` is filled up with the first block (BOS included) and cut at `max_len`.
  Every token is a label (`get_collate_fn`: labels = input_ids; no padding, no EOS).
- `baselines/scripts/unlearn_*.sh`: `MAX_LEN=2048`.
- `dataset.py:131-136` (`ForgetRetainDataset`): forget block i is paired with retain block `i % len(retain)`; an
  epoch is one pass over the forget blocks.

`muse_blocks` builds exactly those blocks: the plugin hands them to the baselines' trainer
(`MUSE.training_examples`, `api.Benchmark.training_examples`), which pairs them as `muse_pairs` does
(`MUSE.retain_pairing = "cycled"`).
"""
from __future__ import annotations

from collections.abc import Sequence

#: MUSE's scripts' `MAX_LEN` (baselines/scripts/unlearn_news.sh:9, unlearn_books.sh:9, unlearn_news_scal.sh:7).
MAX_LEN = 2048
#: How load_data.py joins a split's texts into the `.txt` file the baselines read (load_data.py:33, :40).
JOINER = "\n\n"


def muse_text(texts: Sequence[str]) -> str:
    """A split's texts as the one file MUSE's baselines read (`"\\n\\n".join(raw)`)."""
    return JOINER.join(texts)


def muse_blocks(tokenizer, texts: Sequence[str], max_len: int = MAX_LEN, add_bos: bool = True) -> list[list[int]]:
    """The token blocks MUSE trains on for a split's texts (`DefaultDataset` on its `.txt`), each `max_len` long
    except when the whole text is shorter than one block."""
    if max_len < 2:
        raise ValueError(f"max_len must be at least 2, got {max_len}")
    tokens = list(tokenizer(muse_text(texts), add_special_tokens=False)["input_ids"])
    if not tokens:
        raise ValueError("no tokens to cut into blocks")
    if add_bos:
        bos = tokenizer.bos_token_id
        if bos is None:
            raise ValueError("the tokenizer has no BOS token (MUSE puts one in front of every block)")
        step = max_len - 1
        blocks = [[bos] + tokens[i:i + step] for i in range(0, len(tokens), step)]
    else:
        blocks = [tokens[i:i + max_len] for i in range(0, len(tokens), max_len)]
    if len(blocks[-1]) < max_len:   # dataset.py:74-77: the last block wraps around to the first
        blocks[-1] = (blocks[-1] + blocks[0])[:max_len]
    return blocks


def muse_pairs(n_forget: int, n_retain: int) -> list[tuple[int, int]]:
    """(forget block, retain block) of each example of an epoch, as `ForgetRetainDataset.__getitem__` pairs them."""
    if n_retain <= 0:
        raise ValueError("no retain blocks to pair with")
    return [(i, i % n_retain) for i in range(n_forget)]

