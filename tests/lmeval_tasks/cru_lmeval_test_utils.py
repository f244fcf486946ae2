"""Inline data and process_results for the tiny lm-eval test tasks (tests/test_lmeval_*.py)."""
from datasets import Dataset, DatasetDict

from cru_harness.protocol import EOS_MARKER, has_token_stats

ROWS = [
    {"question": "What colour is the sky?", "answer": "blue", "choices": ["blue", "green", "red"], "label": 0,
     "text": "The sky is blue and the grass is green."},
    {"question": "How many legs has a cat?", "answer": "four", "choices": ["two", "four", "six"], "label": 1,
     "text": "A cat has four legs and a long tail."},
    {"question": "Where do fish live?", "answer": "in water", "choices": ["in trees", "in the sky", "in water"],
     "label": 2, "text": "Fish live in water, birds fly in the sky."},
    {"question": "What do bees make?", "answer": "honey", "choices": ["honey", "milk", "bread"], "label": 0,
     "text": "Bees make honey from the nectar of flowers."},
]


def load(**kwargs):
    return DatasetDict({"test": Dataset.from_list(ROWS)})


def eos_target(doc):
    return " " + doc["answer"] + EOS_MARKER


def process_extended(doc, results):
    """Reports what only `cru` can: NaN-free stats with it, has_stats = 0 with `hf`."""
    res = results[0]
    if not has_token_stats(res):
        return {"has_stats": 0.0, "n_tokens": float("nan"), "sigma_positive": float("nan")}
    return {
        "has_stats": 1.0,
        "n_tokens": float(res.n_tokens),
        "sigma_positive": float(all(s > 0 for s in res.token_sigma)),
    }
