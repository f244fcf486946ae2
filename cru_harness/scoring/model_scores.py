"""The privacy attacks that need the model itself, not only its log-likelihood results: GradNorm (a backward pass
per text) and the reference attack (a second model), as open-unlearning runs them on TOFU
(`src/evals/metrics/mia/gradnorm.py`, `reference.py`; `utils.py:evaluate_probability`, `tokenwise_logprobs`).

Rows are TOFU question-answer dicts; each is written and tokenized as the TOFU tasks score it
(`cru_harness.prompts.qa_texts` + `encode_qa_ids`: the whole text once, the answer's tokens after the prompt's
count, EOS appended when missing), so the scores cover the same tokens as the lm-eval tasks' log-likelihoods.
Not imported by `cru_harness.metrics` (it needs torch). Typical use (a TOFU cell, forget vs holdout)::

    from cru_harness.benchmarks.tofu.data import load_tofu
    from cru_harness.metrics import forget_holdout_auc
    from cru_harness.scoring.model_scores import gradnorm_scores

    forget, holdout = load_tofu("forget10_perturbed"), load_tofu("holdout10")
    auc = forget_holdout_auc(gradnorm_scores(model, tok, forget), gradnorm_scores(model, tok, holdout))
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from ..prompts import DEFAULT_TOFU_PRESET, encode_qa_ids, qa_texts
from ..lmeval.gradnorm import scored_logprobs, text_gradnorm
from ..metrics.privacy import GRADNORM_P, loss_attack, reference_attack

__all__ = ["encode_rows", "scored_logprobs", "gradnorm_scores", "reference_scores", "loss_scores"]


def encode_rows(tokenizer, rows: Iterable[Mapping], *, preset: str = DEFAULT_TOFU_PRESET, family: str | None = None,
                chat: bool | None = None) -> list[tuple[list[int], int]]:
    """`(input_ids, n_prompt)` per row: the TOFU tasks' text and scored span (`prompts.encode_qa_ids`)."""
    out = []
    for row in rows:
        texts = qa_texts(tokenizer, row["question"], row["answer"], preset=preset, family=family, chat=chat)
        out.append(encode_qa_ids(tokenizer, texts))
    return out


def gradnorm_scores(model, tokenizer, rows: Iterable[Mapping], *, p: float = GRADNORM_P, **prompt_kwargs
                    ) -> list[float]:
    """GradNorm per row (`mia/gradnorm.py`; `lmeval.gradnorm.text_gradnorm`): one backward pass per text (batch
    size 1, as open-unlearning's config). Loss-like: larger = less member-like. The model's gradients are left
    cleared: do not call it between a backward pass and the optimizer step that should use it."""
    return [text_gradnorm(model, input_ids, n_prompt, p=p)
            for input_ids, n_prompt in encode_rows(tokenizer, rows, **prompt_kwargs)]


@torch.no_grad()
def reference_scores(model, reference_model, tokenizer, rows: Iterable[Mapping], **prompt_kwargs) -> list[float]:
    """Reference attack per row (`mia/reference.py`): the model's average loss on the scored tokens (EOS
    included, `evaluate_probability`) minus the reference model's on the same tokens. open-unlearning's TOFU
    config names the retain model as the reference (`configs/eval/tofu_metrics/mia_reference.yaml`). Both models
    share `tokenizer`. Loss-like: larger = less member-like than under the reference."""
    scores = []
    for input_ids, n_prompt in encode_rows(tokenizer, rows, **prompt_kwargs):
        target = scored_logprobs(model, input_ids, n_prompt).cpu().numpy()
        ref = scored_logprobs(reference_model, input_ids, n_prompt).cpu().numpy()
        scores.append(reference_attack(target, ref))
    return scores


def loss_scores(model, tokenizer, rows: Iterable[Mapping], **prompt_kwargs) -> list[float]:
    """LOSS per row from the model directly (the lm-eval tasks get the same numbers from `--model cru`)."""
    with torch.no_grad():
        return [loss_attack(scored_logprobs(model, ids, n).cpu().numpy())
                for ids, n in encode_rows(tokenizer, rows, **prompt_kwargs)]
