"""ROUGE recall as TOFU and as RWKU compute it, and LUNAR's deviation score.

The two benchmarks use different ROUGE implementations and the numbers are *not* interchangeable:

* **TOFU** (locuslab/tofu ``evaluate_util.eval_rouge_recall``; open-unlearning ``eval_text_similarity``):
  Google's ``rouge_score`` package, ``RougeScorer(['rouge1', 'rougeL'], use_stemmer=True)``, called as
  ``scorer.score(ground_truth, generation)`` and the ``.recall`` field read. That tokenizer lowercases, drops
  every non-alphanumeric character and applies the Porter stemmer; ``rougeL`` is the plain (sentence-level)
  LCS over the whole text.
* **RWKU** (jinzhuoran/RWKU ``LLaMA-Factory/src/llmtuner/eval/eval_forget.py``): the PyPI package ``rouge``
  1.0.1 (``from rouge import Rouge; Rouge().get_scores(hyps, refs, avg=True)['rouge-l']['r']``), on a
  prediction that is first replaced by ``"NOANSWER"`` when empty or blank and then ``.strip()``-ed.
  :func:`rouge_l_recall_rwku` re-implements that package's code path for one pair (the package is not a
  dependency of this project); see its docstring for every quirk reproduced.
"""
from __future__ import annotations

import functools
import math

from ._checks import as_float, check_text

__all__ = [
    "NOANSWER",
    "rouge_l_recall_tofu",
    "rouge1_recall",
    "rouge_l_recall_rwku",
    "deviation_score",
]

#: What RWKU substitutes for an empty (or whitespace-only) generated answer before scoring.
NOANSWER = "NOANSWER"


@functools.lru_cache(maxsize=None)
def _scorer(rouge_type: str):
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([rouge_type], use_stemmer=True)


def rouge_l_recall_tofu(prediction: str, target: str) -> float:
    """TOFU's ROUGE-L recall of ``prediction`` against the gold ``target``.

    ``rouge_score.rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True).score(target, prediction).recall``,
    exactly as TOFU's ``eval_rouge_recall`` (target first, generation second). Case-insensitive,
    punctuation-blind, stemmed (``"Writing"`` matches ``"writes"``). A target with no alphanumeric token
    scores 0.0 (``rouge_score``'s convention).
    """
    check_text(prediction, "prediction")
    check_text(target, "target")
    return float(_scorer("rougeL").score(target, prediction)["rougeL"].recall)


def rouge1_recall(prediction: str, target: str) -> float:
    """ROUGE-1 recall, computed as TOFU computes its ``rouge1_recall`` (``rouge_score``, stemmer on).

    This is the quantity LUNAR's deviation score is built from (see :func:`deviation_score`).
    """
    check_text(prediction, "prediction")
    check_text(target, "target")
    return float(_scorer("rouge1").score(target, prediction)["rouge1"].recall)


# --------------------------------------------------------------------------------------------------
# RWKU: the `rouge` 1.0.1 package's summary-level ROUGE-L, exclusive (set) mode
# --------------------------------------------------------------------------------------------------

def _rwku_sentences(text: str) -> list[str]:
    # rouge.Rouge._get_avg_scores: split on ".", drop *empty* pieces, then collapse whitespace. A piece that
    # is only whitespace is kept and becomes "" (one empty "word"), as in the package.
    return [" ".join(piece.split()) for piece in text.split(".") if len(piece) > 0]


def _words(sentence: str) -> list[str]:
    # rouge_score._split_into_words: str.split(" "), so "" yields [""].
    return sentence.split(" ")


def _lcs_words(x: list[str], y: list[str]) -> list[str]:
    """The LCS of ``x`` (reference words) and ``y`` (hypothesis words) that ``rouge``'s ``_recon_lcs``
    reconstructs, with its tie-break: on a mismatch move up (drop x[i-1]) only if that keeps a strictly
    longer LCS, otherwise move left."""
    n, m = len(x), len(y)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        xi = x[i - 1]
        row, prev = table[i], table[i - 1]
        for j in range(1, m + 1):
            if xi == y[j - 1]:
                row[j] = prev[j - 1] + 1
            else:
                row[j] = prev[j] if prev[j] >= row[j - 1] else row[j - 1]
    out: list[str] = []
    i, j = n, m
    while i > 0 and j > 0:  # iterative version of the package's recursive _recon
        if x[i - 1] == y[j - 1]:
            out.append(x[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    out.reverse()
    return out


def rouge_l_recall_rwku(prediction: str, target: str) -> float:
    """RWKU's ROUGE-L recall of ``prediction`` against ``target`` (one item of RWKU's averaged score).

    Matches ``rouge`` 1.0.1's ``Rouge().get_scores([pred], [target], avg=True)["rouge-l"]["r"]`` after RWKU's
    pre-processing in ``eval_forget.py`` / ``eval_neighbor.py``:

    1. an empty or whitespace-only prediction becomes ``"NOANSWER"``; the prediction is then ``strip()``-ed
       (the target is used as given);
    2. both texts are split into "sentences" on every ``"."`` (no other punctuation, no abbreviation rules),
       empty pieces dropped, whitespace collapsed; words are ``split(" ")`` - **case-sensitive, no stemming,
       punctuation stays attached** (``"Paris,"`` != ``"Paris"``);
    3. summary-level ROUGE-L in the package's default ``exclusive=True`` mode: for every (reference sentence,
       hypothesis sentence) pair one LCS is reconstructed (the package's tie-break), and the recall is
       ``|union of the words of those LCSs| / |set of distinct reference words|`` - words are counted as a
       *set* across the whole summary, so a repeated reference word counts once in both numerator and
       denominator.

    Deviation (documented): a prediction made only of dots (e.g. ``"..."``) leaves no sentence and the package
    raises ``ValueError`` (RWKU's evaluation would crash); here it scores 0.0. A target with no sentence
    (empty or only dots) raises ``ValueError``, as in the package.
    """
    check_text(prediction, "prediction")
    check_text(target, "target")
    if len(prediction) == 0 or len(prediction.strip()) == 0:
        prediction = NOANSWER
    prediction = prediction.strip()

    ref_sentences = _rwku_sentences(target)
    if not ref_sentences:
        raise ValueError(f"target has no sentence to score against (RWKU's scorer rejects it): {target!r}")
    hyp_sentences = _rwku_sentences(prediction)
    if not hyp_sentences:
        return 0.0

    ref_vocab = {w for s in ref_sentences for w in _words(s)}
    hyp_words = [_words(s) for s in hyp_sentences]
    union: set[str] = set()
    for ref_s in ref_sentences:
        ref_w = _words(ref_s)
        for hw in hyp_words:
            union.update(_lcs_words(ref_w, hw))
    return len(union) / len(ref_vocab)


def deviation_score(r1_forget: float, r1_retain: float) -> float:
    """LUNAR's deviation score: ``100 * sqrt(r1_forget**2 + (1 - r1_retain)**2)``; lower is better.

    ``r1_forget`` / ``r1_retain`` are the mean ROUGE-1 recalls (:func:`rouge1_recall`) on the forget and the
    retain set, each in [0, 1]: the score is the distance (in percent) from the ideal point (0 on forget,
    1 on retain).
    """
    f = as_float(r1_forget, "r1_forget")
    r = as_float(r1_retain, "r1_retain")
    for name, v in (("r1_forget", f), ("r1_retain", r)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must be a ROUGE-1 recall in [0, 1], got {v}")
    return 100.0 * math.sqrt(f * f + (1.0 - r) ** 2)
