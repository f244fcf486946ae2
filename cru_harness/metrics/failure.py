"""How a model fails on forget inputs: each generated answer is ``correct``, ``refusal``, ``degenerate`` or
``wrong`` (protocol.md, "How a model fails on forget inputs"; thresholds from observations.md).

Rules, tried in this order (the first that applies wins):

1. ``correct``: ROUGE-L recall against the reference >= :data:`CORRECT_ROUGE_THRESHOLD` (0.5).
2. ``refusal``: the answer contains one of the refusal phrases (case-, punctuation- and apostrophe-style-
   insensitive, whole words). Pass TOFU's ``idontknow`` list and/or RWKU's reject answers (``data`` loaders);
   :data:`DEFAULT_REFUSAL_PHRASES` holds short generic stems of those lists.
3. ``degenerate``: the answer's mean token NLL under the *original* model > :data:`DEGENERATE_NLL_THRESHOLD`
   (3.0), or it has >= :data:`DEGENERATE_MIN_WORDS` (6) whitespace-separated words and a
   :func:`~cru_harness.metrics.fluency.normalized_fluency_entropy` < :data:`DEGENERATE_ENTROPY_THRESHOLD`
   (0.9). An empty (blank) answer is also ``degenerate`` (the project's choice: RWKU scores it as "NOANSWER").
4. ``wrong``: anything else (a fluent answer that is not the reference).
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from ._checks import as_float, check_text
from .fluency import normalized_fluency_entropy
from .rouge import rouge_l_recall_tofu

__all__ = [
    "CORRECT", "REFUSAL", "DEGENERATE", "WRONG", "ANSWER_CLASSES",
    "CORRECT_ROUGE_THRESHOLD", "DEGENERATE_NLL_THRESHOLD", "DEGENERATE_MIN_WORDS",
    "DEGENERATE_ENTROPY_THRESHOLD", "DEFAULT_REFUSAL_PHRASES",
    "is_refusal", "is_degenerate", "classify_answer", "class_fractions",
]

CORRECT = "correct"
REFUSAL = "refusal"
DEGENERATE = "degenerate"
WRONG = "wrong"
ANSWER_CLASSES: tuple[str, ...] = (CORRECT, REFUSAL, DEGENERATE, WRONG)

#: ROUGE-L recall at or above which an answer is correct (protocol.md).
CORRECT_ROUGE_THRESHOLD = 0.5
#: Mean token NLL under the original model above which an answer is degenerate (observations.md: <= 1.56 for
#: 95 % of the base model's own answers, >= 4.25 for 95 % of gibberish).
DEGENERATE_NLL_THRESHOLD = 3.0
#: Minimum number of words for the repetition rule (RWKU's entropy mostly measures length on short answers).
DEGENERATE_MIN_WORDS = 6
#: Normalised weighted 2/3-gram entropy below which an answer of >= DEGENERATE_MIN_WORDS words is degenerate.
DEGENERATE_ENTROPY_THRESHOLD = 0.9

#: Short stems of TOFU's ``idontknow.jsonl`` / RWKU's reject answers; extend with the full lists.
DEFAULT_REFUSAL_PHRASES: tuple[str, ...] = (
    "i don't know", "i do not know", "i don't have", "i do not have", "i'm not sure", "i am not sure",
    "i'm not certain", "i am not certain", "i'm unable", "i am unable", "i can't", "i cannot",
    "i'm afraid", "i apologize", "i'm not familiar", "i am not familiar", "i'm not aware", "i am not aware",
    "i'm unaware", "i have no knowledge", "i have no information", "i lack", "beyond my", "outside my",
    "not something i'm familiar with", "i'm drawing a blank", "i'm at a loss", "i'm clueless",
    "no idea", "no clue", "a mystery to me", "don't know", "i'm sorry", "i haven't learned",
    "i haven't been trained", "no information on", "no data on", "no knowledge", "not within my knowledge",
    "i'm not able to", "i am not able to", "i'm not knowledgeable", "i'm not informed", "not privy",
)

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'"})
_NON_WORD = re.compile(r"[^\w']+", re.UNICODE)


def _norm(text: str) -> str:
    return " ".join(_NON_WORD.sub(" ", text.translate(_APOSTROPHES).lower()).split())


def is_refusal(answer: str, refusal_phrases: Iterable[str] = DEFAULT_REFUSAL_PHRASES) -> bool:
    """True if a refusal phrase occurs in ``answer`` as whole words, ignoring case, punctuation and the
    apostrophe style (``I’m`` = ``I'm``)."""
    check_text(answer, "answer")
    if isinstance(refusal_phrases, str):
        raise TypeError("refusal_phrases: expected a collection of phrases, got one string")
    hay = f" {_norm(answer)} "
    for phrase in refusal_phrases:
        needle = _norm(check_text(phrase, "refusal phrase"))
        if needle and f" {needle} " in hay:
            return True
    return False


def is_degenerate(answer: str, nll_under_original: float | None = None) -> bool:
    """The ``degenerate`` rule alone (see the module docstring); ``nll_under_original=None`` skips the NLL part."""
    check_text(answer, "answer")
    if not answer.strip():
        return True
    if nll_under_original is not None:
        nll = as_float(nll_under_original, "nll_under_original")
        if nll < 0:
            raise ValueError(f"nll_under_original is a mean negative log-likelihood, got {nll}")
        if nll > DEGENERATE_NLL_THRESHOLD:
            return True
    if len(answer.split()) >= DEGENERATE_MIN_WORDS:
        h = normalized_fluency_entropy(answer)
        if not math.isnan(h) and h < DEGENERATE_ENTROPY_THRESHOLD:
            return True
    return False


def classify_answer(
    answer: str,
    reference: str | None = None,
    *,
    rouge_recall: float | None = None,
    nll_under_original: float | None = None,
    refusal_phrases: Iterable[str] = DEFAULT_REFUSAL_PHRASES,
    scorer: Callable[[str, str], float] = rouge_l_recall_tofu,
) -> str:
    """Class of one generated answer: ``"correct"``, ``"refusal"``, ``"degenerate"`` or ``"wrong"``.

    ``rouge_recall`` is the answer's ROUGE-L recall as the benchmark scored it (TOFU's or RWKU's scorer); when
    it is ``None`` it is computed as ``scorer(answer, reference)`` (default :func:`rouge_l_recall_tofu`; pass
    :func:`~cru_harness.metrics.rouge.rouge_l_recall_rwku` for RWKU). ``nll_under_original`` is the answer's
    mean token NLL under the original model (``None`` when not measured: only the repetition rule is used).
    """
    check_text(answer, "answer")
    if rouge_recall is None:
        if reference is None:
            raise ValueError("classify_answer needs rouge_recall or a reference to compute it from")
        rouge_recall = scorer(answer, check_text(reference, "reference"))
    recall = as_float(rouge_recall, "rouge_recall")
    if not 0.0 <= recall <= 1.0:
        raise ValueError(f"rouge_recall must be in [0, 1], got {recall}")
    if recall >= CORRECT_ROUGE_THRESHOLD:
        return CORRECT
    if is_refusal(answer, refusal_phrases):
        return REFUSAL
    if is_degenerate(answer, nll_under_original):
        return DEGENERATE
    return WRONG


def class_fractions(classes: Sequence[str]) -> dict[str, float]:
    """Fraction of each class in ``classes`` (all four keys, in :data:`ANSWER_CLASSES` order, summing to 1)."""
    if isinstance(classes, str):
        raise TypeError("classes: expected a sequence of class names, got one string")
    classes = list(classes)
    if not classes:
        raise ValueError("classes: empty input")
    unknown = sorted({c for c in classes if c not in ANSWER_CLASSES}, key=str)
    if unknown:
        raise ValueError(f"classes: unknown class(es) {unknown}; expected {list(ANSWER_CLASSES)}")
    counts = Counter(classes)
    return {c: counts[c] / len(classes) for c in ANSWER_CLASSES}
