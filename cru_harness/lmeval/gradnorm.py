"""GradNorm, open-unlearning's gradient-based membership attack (`src/evals/metrics/mia/gradnorm.py`), on token ids:
the `cru` model computes it for requests that carry `protocol.MIA_MARKER`, and
`cru_harness.scoring.model_scores.gradnorm_scores` for TOFU rows. One function, so both score the same."""
from __future__ import annotations

import torch

from ..metrics.privacy import GRADNORM_P, gradnorm_attack


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


def text_gradnorm(model, input_ids: list[int], n_prompt: int, *, p: float = GRADNORM_P) -> float:
    """GradNorm of one text: `loss = -mean` of the scored log-probs without the last (EOS) prediction
    (`tokenwise_logprobs`), one backward pass, then the mean over the parameters of `||grad||_p`.

    As open-unlearning, the model is in train mode for the pass (dropout active where the model has any). Every
    parameter takes part, frozen ones too (a served adapter's base among them), so that methods that change
    weights and methods that attach modules are measured over the same weights; `requires_grad`, the mode and
    the gradients are restored / cleared afterwards."""
    if p not in (1, 2, float("inf")):
        raise ValueError(f"GradNorm's p must be 1, 2 or inf (open-unlearning's choices), got {p}")
    params = list(model.parameters())
    flags = [param.requires_grad for param in params]
    was_training = model.training
    try:
        for param in params:
            param.requires_grad_(True)
        model.train()
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            logp = scored_logprobs(model, input_ids, n_prompt)[:-1]
            if logp.numel() == 0:
                raise ValueError("a scored answer has no token besides EOS: GradNorm needs at least one")
            (-logp.mean()).backward()
        norms = [param.grad.detach().float().norm(p=p).item() for param in params if param.grad is not None]
        return gradnorm_attack(norms)
    finally:
        model.zero_grad(set_to_none=True)
        for param, flag in zip(params, flags):
            param.requires_grad_(flag)
        model.train(was_training)


def with_model_scores(model, requests, results, wanted, *, max_length: int, reference=None, progress: bool = True):
    """`results` (LoglikelihoodResults) with, for each request `wanted` (it carried `protocol.MIA_MARKER`), its
    GradNorm score (one backward pass each, batch size 1 as open-unlearning, through `model` as served: routers
    attached) and, with a `reference` model, its mean loss on the same scored tokens. `requests`: the
    `(key, context ids, scored ids)` the log-likelihoods scored, within `max_length + 1` tokens."""
    from tqdm import tqdm

    from ..protocol import LoglikelihoodResult

    out = list(results)
    for i in tqdm([i for i, want in enumerate(wanted) if want], desc="GradNorm (one backward pass each)",
                  disable=not progress):
        _, ctx_enc, cont_enc = requests[i]
        ids = (ctx_enc + cont_enc)[-(max_length + 1):]   # the window the log-likelihood scored
        score = text_gradnorm(model, ids, len(ids) - len(cont_enc))
        ref_loss = None
        if reference is not None:
            with torch.no_grad():
                ref_loss = -float(scored_logprobs(reference, ids, len(ids) - len(cont_enc)).mean())
        r = out[i]
        out[i] = LoglikelihoodResult(r[0], r[1], r.token_logprobs, r.token_mu, r.token_sigma, r.token_greedy,
                                     r.text, gradnorm=score, reference_loss=ref_loss)
    return out
