"""MUSE for lm-eval: rows, prompts and per-item scores of the `muse_<corpus>_*` tasks.

Loaded by lm-eval from the YAMLs (`!function utils.…`) by file path, and importable as
`cru_harness.benchmarks.muse.tasks.utils`, so absolute imports only. Metadata read (`--metadata '{...}'`):
`data_dir` (a local copy), `muse_tokenizer` (VerbMem's reference cut needs the evaluated model's tokenizer;
default: the model's `pretrained` / `tokenizer` argument, which lm-eval passes on), `muse_retrain_auc` (PrivLeak's
reference AUC; default MUSE's published one for the corpus).
"""
from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping, Sequence

import datasets
from lm_eval.api.task import ConfigurableTask

from cru_harness.benchmarks.muse import data as muse_data
from cru_harness.benchmarks.muse import metrics as muse_metrics
from cru_harness.benchmarks.muse.prompts import (VERBMEM_MAX_NEW_TOKENS, cut_at_stops, knowmem_prompt,
                                                 verbmem_reference)
from cru_harness.errors import InputError
from cru_harness.lmeval.dataset import QuietCustomDataset
from cru_harness.lmeval.request_cache import UncachedRequests
from cru_harness.protocol import JOINT_MARKER, has_token_stats

log = logging.getLogger(__name__)

SETS = ("verbmem_f", "knowmem_f", "knowmem_r", "privleak")


def load_rows(corpus: str, muse_set: str, data_dir=None) -> list[dict]:
    """One task's docs, each with its prompt (`prompt`) and reference (`gt`) or scored text (`text`, `member`)."""
    corpus = muse_data.check_corpus(corpus)
    if muse_set == "verbmem_f":
        return [{"prompt": r["prompt"], "gt": r["gt"]} for r in muse_data.load_split(corpus, "verbmem", "forget",
                                                                                     data_dir)]
    if muse_set in ("knowmem_f", "knowmem_r"):
        part = "forget" if muse_set == "knowmem_f" else "retain"
        icl = muse_data.load_split(corpus, "knowmem", f"{part}_qa_icl", data_dir)
        return [{"prompt": knowmem_prompt(r["question"], icl), "gt": r["answer"], "question": r["question"]}
                for r in muse_data.load_split(corpus, "knowmem", f"{part}_qa", data_dir)]
    if muse_set == "privleak":
        forget = muse_data.load_texts(corpus, "privleak", "forget", data_dir)
        holdout = muse_data.load_texts(corpus, "privleak", "holdout", data_dir)
        # interleaved, so that lm-eval's --limit keeps both sets
        rows = []
        for i in range(max(len(forget), len(holdout))):
            if i < len(forget):
                rows.append({"text": forget[i], "member": False})
            if i < len(holdout):
                rows.append({"text": holdout[i], "member": True})
        return rows
    raise InputError(f"unknown MUSE set {muse_set!r}; expected one of {', '.join(SETS)}")


def load_docs(muse_corpus=None, muse_set=None, data_dir=None, **_ignored) -> datasets.DatasetDict:
    """lm-eval `custom_dataset`: the task's rows as a one-split DatasetDict."""
    from cru_harness.testbed.names import resolve_data_dir

    rows = load_rows(muse_corpus, muse_set, resolve_data_dir(data_dir) if data_dir else None)
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def prompt(doc: Mapping) -> str:
    return doc.get("prompt", "")


def privleak_target(doc: Mapping) -> str:
    """The whole text, scored as MUSE's `compute_ppl` does: encoded with special tokens, every token after the
    first (`protocol.JOINT_MARKER` with an empty context)."""
    return JOINT_MARKER + doc["text"]


@functools.lru_cache(maxsize=4)
def _tokenizer(name: str):
    from transformers import AutoTokenizer

    from cru_harness.testbed.names import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(name))


class MUSETask(QuietCustomDataset, UncachedRequests, ConfigurableTask):
    """A MUSE task: MUSE's plain prompt whatever the model's chat template (MUSE renders none), and scores that need
    the tokenizer (VerbMem's reference) or the metadata (PrivLeak's reference AUC)."""

    def __init__(self, config: dict | None = None) -> None:
        config = {k: v for k, v in (config or {}).items() if k != "class"}
        super().__init__(config=config)

    def fewshot_context(self, doc, num_fewshot, system_instruction=None, apply_chat_template=False,
                        fewshot_as_multiturn=False, chat_template=None, gen_prefix=None):
        if apply_chat_template and not getattr(self, "_warned_chat", False):
            self._warned_chat = True
            log.warning("MUSE renders no chat template: its tasks send the plain prompt")
        return prompt(doc)

    @property
    def _muse_set(self) -> str:
        return (self.config.dataset_kwargs or {})["muse_set"]

    @property
    def _corpus(self) -> str:
        return (self.config.dataset_kwargs or {})["muse_corpus"]

    def _tokenizer_name(self) -> str:
        meta = self.config.metadata or {}
        for key in ("muse_tokenizer", "tokenizer", "pretrained"):
            if meta.get(key):
                return str(meta[key])
        raise InputError(f"{self.config.task}: VerbMem cuts its reference with the evaluated model's tokenizer; "
                         "name it with --metadata '{\"muse_tokenizer\": \"PATH\"}'")

    def retrain_auc(self) -> float:
        value = (self.config.metadata or {}).get("muse_retrain_auc")
        if value in (None, ""):
            return muse_metrics.MUSE_RETRAIN_AUC[self._corpus]
        try:
            value = float(value)
        except (TypeError, ValueError):
            value = math.nan
        if not 0 < value <= 1:
            raise InputError(f"--metadata muse_retrain_auc={value!r}: expected an AUC in (0, 1]")
        return value

    def process_results(self, doc, results):
        if self._muse_set == "privleak":
            result = results[0]
            if not has_token_stats(result) or result.n_tokens == 0:
                raise InputError(f"{self.config.task} needs per-token log-probs: run it with the `cru` model")
            item = {"member": bool(doc["member"]), "score": muse_metrics.min_k_prob(result.token_logprobs),
                    "retrain_auc": self.retrain_auc()}
            return {"auc": item, "privleak": item}
        output = results[0]
        gt = doc["gt"]
        if self._muse_set == "verbmem_f":
            gt = verbmem_reference(gt, _tokenizer(self._tokenizer_name()), VERBMEM_MAX_NEW_TOKENS)
        else:
            output = cut_at_stops(output)   # lm-eval's stops did it already; MUSE cuts after generating
        f1, recall = muse_metrics.rouge_l(gt, output)
        return {"rougeL_f1": f1, "rougeL_recall": recall}


# ---------------------------------------------------------------------------------------------- aggregations

def _split(items: Sequence[Mapping]) -> tuple[list[float], list[float]]:
    forget = [i["score"] for i in items if not i["member"]]
    holdout = [i["score"] for i in items if i["member"]]
    if not forget or not holdout:
        raise InputError("MUSE PrivLeak needs forget and holdout texts (a --limit below 2 keeps one set only)")
    return forget, holdout


def auc(items: Sequence[Mapping]) -> float:
    """MUSE's forget-vs-holdout Min-40% AUC (0.5: cannot tell them apart)."""
    return muse_metrics.privleak_auc(*_split(items))


def privleak(items: Sequence[Mapping]) -> float:
    """(AUC - AUC_retrain) / AUC_retrain x 100."""
    return muse_metrics.privleak(auc(items), items[0]["retrain_auc"])


def percent_mean(values: Sequence[float]) -> float:
    """The mean x 100 (MUSE's table reports VerbMem and KnowMem in percent)."""
    return 100.0 * sum(values) / len(values)
