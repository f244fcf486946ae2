"""The privacy attacks that need the model itself, not only its log-likelihood results: GradNorm (a backward pass
per text) and the reference attack (a second model), as open-unlearning runs them on TOFU
(`src/evals/metrics/mia/gradnorm.py`, `reference.py`; `utils.py:evaluate_probability`, `tokenwise_logprobs`).

Rows are TOFU question-answer dicts; each is written and tokenized as the TOFU tasks score it
(`cru_harness.prompts.qa_texts` + `encode_qa_ids`: the whole text once, the answer's tokens after the prompt's
count, EOS appended when missing), so the scores cover the same tokens as the lm-eval tasks' log-likelihoods.
Not imported by `cru_harness.metrics` (it needs torch). Typical use (a TOFU cell, forget vs holdout)::

    from cru_harness.data.tofu import load_tofu
    from cru_harness.metrics import forget_holdout_auc
    from cru_harness.scoring.model_scores import gradnorm_scores

    forget, holdout = load_tofu("forget10_perturbed"), load_tofu("holdout10")
    auc = forget_holdout_auc(gradnorm_scores(model, tok, forget), gradnorm_scores(model, tok, holdout))
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from ..prompts import DEFAULT_TOFU_PRESET, encode_qa_ids, qa_texts
from ..metrics.privacy import GRADNORM_P, gradnorm_attack, loss_attack, reference_attack

__all__ = ["encode_rows", "scored_logprobs", "gradnorm_scores", "reference_scores", "loss_scores"]


def encode_rows(tokenizer, rows: Iterable[Mapping], *, preset: str = DEFAULT_TOFU_PRESET, family: str | None = None,
                chat: bool | None = None) -> list[tuple[list[int], int]]:
    """`(input_ids, n_prompt)` per row: the TOFU tasks' text and scored span (`prompts.encode_qa_ids`)."""
    out = []
    for row in rows:
        texts = qa_texts(tokenizer, row["question"], row["answer"], preset=preset, family=family, chat=chat)
        out.append(encode_qa_ids(tokenizer, texts))
    return out


def scored_logprobs(model, input_ids: list[int], n_prompt: int) -> torch.Tensor:
    """log p of every scored token (positions `n_prompt..`, EOS included) under `model`, in the graph (so a caller
    may backpropagate through it)."""
    if not 0 < n_prompt < len(input_ids):
        raise ValueError(f"nothing to score: {len(input_ids)} ids with a prompt of {n_prompt}")
    device = next(model.parameters()).device
    ids = torch.tensor([input_ids], dtype=torch.long, device=device)
    logits = model(input_ids=ids).logits[0, :-1].float()
    logp = torch.log_softmax(logits, dim=-1)
    targets = ids[0, 1:]
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked[n_prompt - 1:]   # the prediction of ids[n_prompt] is at position n_prompt - 1


def gradnorm_scores(model, tokenizer, rows: Iterable[Mapping], *, p: float = GRADNORM_P, **prompt_kwargs
                    ) -> list[float]:
    """GradNorm per row (`mia/gradnorm.py`): `loss = -mean` of the scored log-probs without the EOS prediction
    (`tokenwise_logprobs`), one backward pass per text (batch size 1, as open-unlearning's config), then the mean
    over parameters with a gradient of `||grad||_p`. Loss-like: larger = less member-like.

    As open-unlearning, the model is put in train mode for the pass (dropout active where the model has any) and
    its gradients are zeroed: do not call it between a backward pass and the optimizer step that should use it.
    The model's mode is restored afterwards and its gradients are left cleared."""
    if p not in (1, 2, float("inf")):
        raise ValueError(f"GradNorm's p must be 1, 2 or inf (open-unlearning's choices), got {p}")
    was_training = model.training
    scores = []
    try:
        model.train()
        for input_ids, n_prompt in encode_rows(tokenizer, rows, **prompt_kwargs):
            logp = scored_logprobs(model, input_ids, n_prompt)[:-1]   # tokenwise_logprobs: no EOS prediction
            if logp.numel() == 0:
                raise ValueError("a scored answer has no token besides EOS: GradNorm needs at least one")
            model.zero_grad(set_to_none=True)
            (-logp.mean()).backward()
            norms = [param.grad.detach().float().norm(p=p).item() for param in model.parameters()
                     if param.grad is not None]
            scores.append(gradnorm_attack(norms))
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return scores


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
