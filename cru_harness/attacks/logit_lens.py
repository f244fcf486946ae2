"""The logit lens: does an intermediate layer still know the forgotten answer?

Source: nostalgebraist 2020, "interpreting GPT: the logit lens"; used against unlearning by Łucki et al. 2024
(arXiv:2409.18025) and Patil et al. 2024 ("Can Sensitive Information Be Deleted From LLMs?", ICLR 2024), who
find answers that the output no longer gives still readable from middle layers.

For each decoder block l, its output h_l is read as the last one is: `lm_head(final_norm(h_l))`. The score of a
layer is TOFU's forget probability computed from those logits (per item, the geometric mean of the answer
tokens' probabilities, averaged over items). The last layer's score is the model's own. For CRU the routers are
attached, so each h_l is the gated state the next block reads (the model as served).

It reads the model and returns no model, so it is a metric, not a runner attack: `logit_lens_scores` gives the
per-layer scores and the best layer. Report it per cell as "best-layer forget probability (layer l of L)" next to
the output's forget probability; the recovery score (`metrics.recovery`) applies to it with the original model's
best-layer value as the top of the gap (`reporting.tables.lens_rows`, with the oracle's best over its output).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..training.blocks import FINAL_NORMS, find_final_norm


@dataclass
class LensResult:
    """`per_layer[l]`: the forget probability read at block l's output (0-based); `best_layer`, `best`: its
    maximum; `final`: the last layer's (the model's own); `n_items`: items averaged."""
    per_layer: list[float]
    best_layer: int
    best: float
    final: float
    n_items: int

    def to_dict(self) -> dict:
        return {"per_layer": self.per_layer, "best_layer": self.best_layer, "best": self.best, "final": self.final,
                "n_items": self.n_items, "n_layers": len(self.per_layer)}


def final_norm(model) -> torch.nn.Module:
    """The norm applied before the output head (Llama/Qwen/Phi-3: `model.norm`; GPT-2, GPT-NeoX, ...)."""
    if (norm := find_final_norm(model)) is not None:
        return norm
    raise ValueError(f"logit lens: no final norm found in {type(model).__name__} (looked for {', '.join(FINAL_NORMS)})")


@torch.no_grad()
def logit_lens_scores(model, tokenizer, rows: list[dict], *, routers: str | list | None = None,
                      prompt_format: dict | None = None, max_length: int = 512) -> LensResult:
    """Per-layer forget probability of question-answer `rows` (written with `prompt_format`, the keywords of
    `baselines.data.encode_qa`). `routers`: a bundle directory (`dir+dir` for several) or bundles, attached for
    the reading and removed after."""
    from ..baselines.data import encode_qa, row_to_qa
    from ..cru.attach import attach_bundles
    from ..training.blocks import block_output_tensor, find_decoder_blocks
    from ..devices import input_device
    from .relearn import load_bundles

    if not rows:
        raise ValueError("logit lens: no rows")
    fmt = {k: v for k, v in (prompt_format or {}).items() if k in ("chat", "preset", "family", "benchmark")}
    bundles = load_bundles(routers) if isinstance(routers, str) else list(routers or [])
    model.eval()
    norm, head = final_norm(model), model.get_output_embeddings()
    _, blocks = find_decoder_blocks(model)
    captured: dict[int, torch.Tensor] = {}
    handle = attach_bundles(model, bundles) if bundles else None
    # registered after the routers' hooks, so each reads the block's output as gated
    hooks = [block.register_forward_hook(lambda _m, _i, out, i=i: captured.__setitem__(i, block_output_tensor(out)))
             for i, block in enumerate(blocks)]
    sums = [0.0] * len(blocks)
    device = input_device(model)
    head_device = next(norm.parameters(), head.weight).device   # under a device map the blocks sit elsewhere
    try:
        for index, row in enumerate(rows):
            example = encode_qa(tokenizer, *row_to_qa(row, index), max_length, **fmt)
            ids = torch.tensor([example.input_ids], device=device)
            labels = torch.tensor(example.labels[1:], device=head_device)
            answer = labels != -100
            captured.clear()
            model(input_ids=ids)
            for layer in range(len(blocks)):
                # the norm is per position: read the head at the answer's positions only (the vocabulary
                # projection is most of the lens's cost)
                hidden = captured[layer].to(head_device)[0, :-1][answer]
                logp = torch.log_softmax(head(norm(hidden)).float(), dim=-1).gather(1, labels[answer][:, None])
                sums[layer] += float(logp.mean().exp())
    finally:
        for hook in hooks:
            hook.remove()
        if handle is not None:
            handle.remove()
    per_layer = [s / len(rows) for s in sums]
    best = max(range(len(per_layer)), key=per_layer.__getitem__)
    return LensResult(per_layer=per_layer, best_layer=best, best=per_layer[best], final=per_layer[-1],
                      n_items=len(rows))
