"""MUSE's prompts and generation lengths (swj0419/muse_bench at fcd6651: `eval.py`, `metrics/verbmem.py`,
`metrics/knowmem.py`). Plain text, no chat template: MUSE's models are base models and its code renders none.

- VerbMem: the dataset's `prompt` (the first tokens of a forget passage, cut by MUSE when it built the set) is the
  whole prompt; the model continues it greedily for 128 new tokens (`verbmem_max_new_tokens`), no stop string; the
  reference is `gt` cut to its first 128 tokens as MUSE's tokenizer call gives them (BOS included, so 127 text
  tokens on Llama-2), decoded without special tokens.
- KnowMem: the few-shot examples of the `*_qa_icl` split, each `Question: {q}\\nAnswer: {a}\\n\\n`, then
  `Question: {q}\\nAnswer: ` (trailing space, as MUSE); greedy, 32 new tokens (`knowmem_max_new_tokens`); the
  answer is cut before the first of "\\n\\n", "\\nQuestion", "Question:".
Both encode the prompt with the tokenizer's own special tokens (`add_special_tokens=True`: BOS on Llama).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

VERBMEM_MAX_NEW_TOKENS = 128
KNOWMEM_MAX_NEW_TOKENS = 32
KNOWMEM_STOPS = ("\n\n", "\nQuestion", "Question:")


def knowmem_shots(icl_rows: Iterable[Mapping]) -> str:
    """MUSE's few-shot block: every ICL pair, in order."""
    return "".join(f"Question: {row['question']}\nAnswer: {row['answer']}\n\n" for row in icl_rows)


def knowmem_prompt(question: str, icl_rows: Iterable[Mapping] = ()) -> str:
    return knowmem_shots(icl_rows) + f"Question: {question}\nAnswer: "


def cut_at_stops(text: str, stops: Iterable[str] = KNOWMEM_STOPS) -> str:
    """The answer before the first stop string (MUSE's `get_prefix_before_words_occur`)."""
    for stop in stops:
        text = text.split(stop)[0]
    return text


def verbmem_reference(gt: str, tokenizer, max_new_tokens: int = VERBMEM_MAX_NEW_TOKENS) -> str:
    """The ground truth VerbMem compares against: `gt`'s first `max_new_tokens` tokens (the tokenizer's special
    tokens included, as MUSE encodes it), decoded without them."""
    ids = tokenizer(gt, add_special_tokens=True)["input_ids"][:max_new_tokens]
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=True)
