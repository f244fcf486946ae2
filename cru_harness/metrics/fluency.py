"""n-gram entropy and RWKU's fluency score (weighted 2/3-gram entropy).

Reference: jinzhuoran/RWKU ``LLaMA-Factory/src/llmtuner/eval/eval_fluency.py`` (``compute_n_gram_entropy``,
``compute_freq``; itself from the ROME/MEMIT evaluation code): tokens from ``nltk.word_tokenize``, n-gram
frequency distribution, Shannon entropy in **bits**, ``ns=[2, 3]``, ``weights=[2/3, 4/3]``, arithmetic mean of
the weighted entropies (so ``H2/3 + 2*H3/3``); the reported number is the mean over answers.

Tokenisation: ``nltk.word_tokenize`` needs NLTK's ``punkt`` sentence model, a data download that offline
machines lack. The default tokenizer here, :func:`word_tokenize`, does what ``nltk.word_tokenize`` does
(split into sentences, then NLTK's Treebank word tokenizer on each sentence) with a regex sentence splitter
(after ``.``, ``!`` or ``?`` followed by whitespace) in place of punkt. They differ only where punkt would not
break (abbreviations such as "Mr. Smith": the default keeps "Mr" and "." apart). Pass
``tokenizer=nltk.word_tokenize`` where punkt is installed to reproduce RWKU token for token.
"""
from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._checks import as_float, check_text

__all__ = [
    "FLUENCY_NS",
    "FLUENCY_WEIGHTS",
    "word_tokenize",
    "ngram_entropy",
    "fluency_entropy",
    "normalized_fluency_entropy",
    "mean_fluency_entropy",
]

#: RWKU's n-gram orders and weights for the fluency score.
FLUENCY_NS: tuple[int, ...] = (2, 3)
FLUENCY_WEIGHTS: tuple[float, ...] = (2 / 3, 4 / 3)

Tokenizer = Callable[[str], Sequence[str]]

_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+")


@functools.lru_cache(maxsize=1)
def _treebank():
    from nltk.tokenize import NLTKWordTokenizer  # no data files needed (unlike punkt)

    return NLTKWordTokenizer()


def word_tokenize(text: str) -> list[str]:
    """``nltk.word_tokenize`` without the punkt download (see the module docstring)."""
    check_text(text, "text")
    tok = _treebank()
    return [t for sent in _SENTENCE_BREAK.split(text.strip()) if sent for t in tok.tokenize(sent)]


def _ngram_counts(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def _entropy_bits(counts: Counter) -> float:
    if not counts:
        return 0.0  # RWKU: an empty frequency array sums to 0.0
    freqs = np.array(list(counts.values()), dtype=float)
    freqs /= freqs.sum()
    return float(np.sum(-freqs * np.log(freqs) / np.log(2)))


def _tokens(text: str, tokenizer: Tokenizer | None) -> list[str]:
    check_text(text, "text")
    return list((tokenizer or word_tokenize)(text))


def _check_n(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    return int(n)


def ngram_entropy(text: str, n: int, *, tokenizer: Tokenizer | None = None) -> float:
    """Shannon entropy (bits) of the frequency distribution of the word n-grams of ``text``.

    0.0 when the text has fewer than ``n`` tokens (RWKU's value: its frequency array is empty).
    """
    return _entropy_bits(_ngram_counts(_tokens(text, tokenizer), _check_n(n)))


def _weighted(values: Sequence[float]) -> float:
    return float(np.mean(np.asarray(values) * np.asarray(FLUENCY_WEIGHTS)))


def fluency_entropy(text: str, *, tokenizer: Tokenizer | None = None) -> float:
    """RWKU's fluency of one text: ``mean(2/3 * H_2, 4/3 * H_3)`` with ``H_n`` = :func:`ngram_entropy` (bits).

    Mostly grows with length for short texts (``log2`` of the n-gram count when all n-grams are distinct);
    see :func:`normalized_fluency_entropy` for a length-free version.
    """
    toks = _tokens(text, tokenizer)
    return _weighted([_entropy_bits(_ngram_counts(toks, n)) for n in FLUENCY_NS])


def normalized_fluency_entropy(text: str, *, tokenizer: Tokenizer | None = None) -> float:
    """:func:`fluency_entropy` divided by its maximum for a text of the same token count.

    ``sum_n w_n H_n / sum_n w_n log2(N_n)`` with ``N_n`` the number of n-grams (``H_n <= log2 N_n``, equality
    when every n-gram is distinct). 1.0 = no n-gram repeats; a text looping one phrase tends to 0. This
    project's definition for the "degenerate" answer class (``failure.py``); NaN when the text has fewer than 3
    tokens (no 3-gram: the ratio is undefined).
    """
    toks = _tokens(text, tokenizer)
    num = [_entropy_bits(_ngram_counts(toks, n)) for n in FLUENCY_NS]
    den = [math.log2(len(toks) - n + 1) if len(toks) - n + 1 > 0 else 0.0 for n in FLUENCY_NS]
    if len(toks) < max(FLUENCY_NS) or _weighted(den) == 0.0:
        return math.nan
    return _weighted(num) / _weighted(den)


def mean_fluency_entropy(texts: Sequence[str], *, tokenizer: Tokenizer | None = None) -> float:
    """RWKU's reported fluency: the arithmetic mean of :func:`fluency_entropy` over the answers."""
    if isinstance(texts, str):
        raise TypeError("texts: expected a sequence of strings, got one string")
    texts = list(texts)
    if not texts:
        raise ValueError("texts: empty input")
    return as_float(np.mean([fluency_entropy(t, tokenizer=tokenizer) for t in texts]), "mean fluency")
