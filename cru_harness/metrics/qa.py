"""Short-answer scoring for RWKU's utility sets: TriviaQA token F1, exact match, BBH answer extraction.

Reference: jinzhuoran/RWKU ``LLaMA-Factory/src/llmtuner/eval/eval_triviaqa.py`` and ``eval_bbh.py``
(``Metric._normalize_text``, ``F1._f1_score``, ``EM._exact_match_score``; code from McGill-NLP/topiocqa). The
normalisation is SQuAD's: lowercase, delete ASCII punctuation, replace the articles a/an/the by a space,
collapse whitespace.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

from ._checks import check_text
from .rouge import NOANSWER

__all__ = ["normalize_answer", "token_f1", "exact_match", "exact_match_rwku_bbh", "extract_bbh_answer"]

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """RWKU's / SQuAD's answer normalisation (lower, no punctuation, no articles, single spaces)."""
    check_text(text, "text")
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _tokens(text: str) -> list[str]:
    return normalize_answer(text).split() if text else []


def _aliases(answers: str | Sequence[str]) -> list[str]:
    if isinstance(answers, str):
        return [answers]  # one alias (RWKU's code would iterate over its characters; see exact_match)
    aliases = list(answers)
    if not aliases:
        raise ValueError("answers: no reference answer given")
    for a in aliases:
        check_text(a, "answers[...]")
    return aliases


def _f1(prediction: str, reference: str) -> float:
    ref, pred = _tokens(reference), _tokens(prediction)
    if not ref or not pred:
        return float(ref == pred)  # both empty -> 1, one empty -> 0
    common = sum((Counter(ref) & Counter(pred)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, answers: str | Sequence[str]) -> float:
    """TriviaQA F1: the maximum over the answer aliases of the bag-of-tokens F1 after :func:`normalize_answer`.

    Matches RWKU's ``F1._f1`` (the generation is scored as is - RWKU does not strip or cut it; stopping the
    generation is the task's job). ``answers`` is a list of aliases (RWKU's ``answers`` field, a Python-literal
    string in the files, parsed by the data loader) or a single alias string.
    """
    check_text(prediction, "prediction")
    return max(_f1(prediction, a) for a in _aliases(answers))


def exact_match(prediction: str, answers: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction equals a normalised answer alias, else 0.0 (RWKU's ``EM``).

    A single string is one alias. (RWKU's BBH scorer passes the target *string* where a list of aliases is
    expected, so its ``max`` runs over the target's characters: "(A)" is matched by a prediction normalising to
    "a", and a multi-character target such as "False" can never match. This function scores against the whole
    target instead; see the project's open questions.)
    """
    check_text(prediction, "prediction")
    pred = _tokens(prediction)
    return float(any(pred == _tokens(a) for a in _aliases(answers)))


def exact_match_rwku_bbh(prediction: str, target: str) -> float:
    """RWKU's BBH score as its code computes it (`eval_bbh.py:95-109,158-159`): `EM` receives the target *string*
    where a list of aliases is expected, so the maximum runs over the target's characters: 1.0 iff the
    normalised prediction equals one normalised character of the target ("(A)" is matched by "A", "False" by
    nothing). The protocol reports it as `exact_match`; `exact_match` (this module) against the whole target is
    the project's separately named `exact_match_target`."""
    check_text(prediction, "prediction")
    check_text(target, "target")
    pred = _tokens(prediction)
    return float(any(pred == _tokens(ch) for ch in target))


_BBH_ANSWER = re.compile(r"[t|T]he answer is (.*?)\.")


def extract_bbh_answer(output: str) -> str:
    """RWKU's BBH answer extraction: the text after the first "the answer is" / "The answer is" up to the next
    ".", stripped; the whole (stripped) output when there is no such phrase; ``"NOANSWER"`` when empty."""
    check_text(output, "output")
    found = _BBH_ANSWER.search(output)
    answer = found.group(1).strip() if found else output.strip()
    return answer if answer else NOANSWER
