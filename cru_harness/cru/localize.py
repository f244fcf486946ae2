"""Phase 1 of CRU: find, per selected decoder block, the coordinates whose pooled activation varies most over
the forget set (`cru_method.md`, "Phase 1"). One forward pass, no backward, no LM head."""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy import stats
from torch import nn

from ..devices import input_device  # noqa: F401  (the one place; re-exported for cru.train / cru.prefix)
from ..errors import InputError
from ..prompts import encode_text
from ..training.blocks import block_output_tensor, find_decoder_blocks, num_layers, resolve_block_indices, run_until
from ..training.sites import mlp_down_projection, validate_gate_site
from .readings import (BLOCK_OUTPUTS, LOCALIZATION_TOKENS, PromptTemplate, content_mask, hf_entries_to_blocks,
                       run_until_site, site_module, validate_choice)

SELECTIONS = ("variance", "random")


@dataclass
class Batch:
    """Right-padded token ids and their attention mask (1 = real token)."""
    input_ids: torch.Tensor
    attention_mask: torch.Tensor

    def to(self, device) -> "Batch":
        return Batch(self.input_ids.to(device), self.attention_mask.to(device))


def tokenize_texts(tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids of each text, truncated to `max_length`; an error if a text yields no tokens."""
    if max_length < 1:
        raise InputError(f"max_length must be positive, got {max_length}")
    # the evaluation's rule (prompts.encode_text): chat-template text that carries its own BOS gets no second one
    ids = [encode_text(tokenizer, text, max_length=max_length) for text in texts]
    for row, tokens in enumerate(ids):
        if not tokens:
            raise InputError(f"text #{row} tokenizes to nothing: {texts[row][:60]!r}")
    return ids


def collate(token_lists: Sequence[Sequence[int]], pad_id: int, pad_to: int | None = None) -> Batch:
    """Right-pad token lists to the longest (or to `pad_to`). Right padding leaves real positions' causal
    context untouched, and the mask removes the padded ones from every statistic."""
    length = max(len(t) for t in token_lists)
    if pad_to is not None:
        if pad_to < length:
            raise ValueError(f"pad_to={pad_to} is shorter than the longest sequence ({length})")
        length = pad_to
    input_ids = torch.full((len(token_lists), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(token_lists), length), dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        input_ids[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        attention_mask[row, :len(tokens)] = 1
    return Batch(input_ids, attention_mask)


def pad_token_id(tokenizer) -> int:
    """The tokenizer's pad id, falling back to EOS (padded positions are masked out anyway)."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0


def iter_batches(tokenizer, texts: Sequence[str], batch_size: int, max_length: int) -> Iterator[Batch]:
    """Batches of `texts` in their order, right-padded to each batch's longest sequence."""
    if batch_size < 1:
        raise InputError(f"batch_size must be positive, got {batch_size}")
    ids = tokenize_texts(tokenizer, texts, max_length)
    pad = pad_token_id(tokenizer)
    for start in range(0, len(ids), batch_size):
        yield collate(ids[start:start + batch_size], pad)


@dataclass
class Localization:
    """Result of Phase 1: selected coordinates `neurons[l]` (sorted LongTensor) and the per-coordinate
    variances `variances[l]` (float32) of every block in `block_indices`, at `site` ("residual": the block's
    output; "mlp": its MLP neurons). `excluded[l]` holds the coordinates kept out of selection by
    `exclude_top_magnitude` (empty without it)."""
    block_indices: list[int]
    neurons: dict[int, torch.Tensor]
    variances: dict[int, torch.Tensor]
    percentile: float
    selection: str
    seed: int = 0
    n_examples: int = 0
    extra: dict = field(default_factory=dict)
    site: str = "residual"
    exclude_top_magnitude: float = 0.0
    excluded: dict[int, torch.Tensor] = field(default_factory=dict)
    block_output: str = "block"     # readings.BLOCK_OUTPUTS: where a block's output was read
    tokens: str = "all"             # readings.LOCALIZATION_TOKENS: which positions were pooled

    def sizes(self) -> dict[int, int]:
        return {block: int(idx.numel()) for block, idx in self.neurons.items()}

    def width(self) -> int:
        """Coordinates per block at the site (the hidden size for the residual stream)."""
        return int(next(iter(self.variances.values())).numel())


def validate_percentile(percentile: float) -> float:
    try:
        value = float(percentile)
    except (TypeError, ValueError):
        raise InputError(f"percentile must be a number in (0, 100), got {percentile!r}") from None
    if not 0.0 < value < 100.0:
        raise InputError(f"percentile must be strictly between 0 and 100, got {percentile!r}")
    return value


def validate_exclusion(exclude_top_magnitude: float) -> float:
    try:
        value = float(exclude_top_magnitude)
    except (TypeError, ValueError):
        raise InputError(f"exclude_top_magnitude must be a percentage in [0, 100), "
                         f"got {exclude_top_magnitude!r}") from None
    if isinstance(exclude_top_magnitude, bool) or not 0.0 <= value < 100.0:
        raise InputError(f"exclude_top_magnitude must be a percentage in [0, 100), got {exclude_top_magnitude!r}")
    return value


@torch.no_grad()
def pooled_activations(model: nn.Module, batches: Iterable[Batch], block_indices: Sequence[int], *,
                       site: str = "residual", magnitude: bool = False, block_output: str = "block",
                       template: PromptTemplate | None = None
                       ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor] | None]:
    """Per example, the mean over non-padding positions of each block's activations at `site` (the block's
    output, or its MLP neurons: the input of the MLP's down projection), in float32: `{l: (N, width)}`; with
    `magnitude`, also the mean |activation| per coordinate over every non-padding token: `{l: (width,)}`.
    `block_output`: where a block's output is read (`readings.py`); `template`: pool over the content positions
    only (`readings.content_mask`: no template or special token), not every real one.

    Hooks capture the activations; the forward stops after the last needed block.
    """
    validate_gate_site(site)
    validate_choice("block_output", block_output, BLOCK_OUTPUTS)
    _, blocks = find_decoder_blocks(model)
    pooled: dict[int, list[torch.Tensor]] = {l: [] for l in block_indices}
    abs_sums: dict[int, torch.Tensor] = {}
    tokens = [0.0]
    current_mask: list[torch.Tensor] = []

    def record(index: int, hidden: torch.Tensor) -> None:
        hidden = hidden.float()
        mask = current_mask[0].to(hidden.device, torch.float32).unsqueeze(-1)
        summed = (hidden * mask).sum(dim=1)
        pooled[index].append((summed / mask.sum(dim=1).clamp_min(1.0)).cpu())
        if magnitude:  # float64 sums: a corpus of many tokens, some coordinates of magnitude ~1e4
            total = (hidden.abs() * mask).sum(dim=(0, 1)).double().cpu()
            abs_sums[index] = abs_sums[index] + total if index in abs_sums else total

    def make_hook(index: int):
        if site == "residual":
            def hook(_module, _args, output):
                record(index, block_output_tensor(output))
            return site_module(model, index, block_output).register_forward_hook(hook)

        def pre_hook(_module, args):
            record(index, args[0])
        return mlp_down_projection(blocks[index], index).register_forward_pre_hook(pre_hook)

    handles = [make_hook(l) for l in block_indices]
    was_training = model.training
    model.eval()
    try:
        device = input_device(model)
        for batch in batches:
            batch = batch.to(device)
            pool = batch.attention_mask if template is None else content_mask(
                [ids[:int(n)] for ids, n in zip(batch.input_ids.tolist(), batch.attention_mask.sum(dim=1).tolist())],
                template, batch.input_ids.shape[1]).to(device)
            current_mask[:] = [pool]
            tokens[0] += float(pool.sum())
            if block_output == "block" or site != "residual":
                run_until(model, blocks, max(block_indices),
                          input_ids=batch.input_ids, attention_mask=batch.attention_mask)
            else:
                run_until_site(model, max(block_indices), block_output,
                               input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    result = {l: torch.cat(chunks) if chunks else torch.empty(0) for l, chunks in pooled.items()}
    mean_abs = {l: (total / max(tokens[0], 1.0)).float() for l, total in abs_sums.items()} if magnitude else None
    return result, mean_abs


def pooled_block_outputs(model: nn.Module, batches: Iterable[Batch], block_indices: Sequence[int]
                         ) -> dict[int, torch.Tensor]:
    """Mean of each block's output over non-padding positions, per example, in float32: `{l: (N, d)}`."""
    return pooled_activations(model, batches, block_indices)[0]


def top_magnitude(mean_abs: dict[int, torch.Tensor], exclude_top_magnitude: float) -> dict[int, torch.Tensor]:
    """Per block, the `ceil(q% of width)` coordinates of largest mean |activation| (sorted; none for q = 0):
    the extreme-magnitude outlier dimensions `exclude_top_magnitude` keeps out of selection."""
    q = validate_exclusion(exclude_top_magnitude)
    excluded = {}
    for block, values in sorted(mean_abs.items()):
        k = math.ceil(q / 100.0 * values.numel()) if q > 0 else 0
        if values.numel() - k < 2:
            raise InputError(f"block {block}: exclude_top_magnitude={q} leaves {values.numel() - k} of "
                             f"{values.numel()} coordinates; selection needs at least 2")
        order = torch.argsort(values.double(), descending=True, stable=True)
        excluded[block] = torch.sort(order[:k]).values.long()
    return excluded


def select_neurons(variances: dict[int, torch.Tensor], percentile: float, selection: str = "variance",
                   seed: int = 0, excluded: dict[int, torch.Tensor] | None = None) -> dict[int, torch.Tensor]:
    """`C_l = {j : var_j > quantile_p(var)}` per block; with `selection="random"`, the same number of
    coordinates per block drawn uniformly (seeded) instead. Coordinates in `excluded[l]` are no candidates:
    the quantile, the selection and the random draw all run on the remaining ones."""
    percentile = validate_percentile(percentile)
    if selection not in SELECTIONS:
        raise InputError(f"selection must be one of {', '.join(SELECTIONS)}, got {selection!r}")
    generator = torch.Generator().manual_seed(int(seed))
    neurons = {}
    for block in sorted(variances):
        var = variances[block].double()
        drop = (excluded or {}).get(block)
        if drop is not None and drop.numel():
            keep = torch.ones(var.numel(), dtype=torch.bool)
            keep[drop] = False
            candidates = torch.nonzero(keep).flatten()
        else:
            candidates = None  # every coordinate (the paper's selection, unchanged)
        pool = var if candidates is None else var[candidates]
        threshold = torch.quantile(pool, percentile / 100.0)
        chosen = torch.nonzero(pool > threshold).flatten()
        if chosen.numel() == 0:
            raise InputError(f"block {block}: no coordinate has variance above the {percentile}th percentile "
                             "(all variances equal?); use more or more varied forget examples or a lower "
                             "percentile")
        if selection == "random":
            chosen = torch.randperm(pool.numel(), generator=generator)[:chosen.numel()]
        if candidates is not None:
            chosen = candidates[chosen]
        neurons[block] = torch.sort(chosen).values.long()
    return neurons


def localize_batches(model: nn.Module, batches: Iterable[Batch], *, block_indices: Sequence[int],
                     percentile: float = 95.0, selection: str = "variance", seed: int = 0,
                     site: str = "residual", exclude_top_magnitude: float = 0.0, block_output: str = "block",
                     template: PromptTemplate | None = None) -> Localization:
    """`localize` on pre-built batches (lets callers control padding)."""
    percentile = validate_percentile(percentile)
    exclude_top_magnitude = validate_exclusion(exclude_top_magnitude)
    pooled, mean_abs = pooled_activations(model, batches, block_indices, site=site,
                                          magnitude=exclude_top_magnitude > 0, block_output=block_output,
                                          template=template)
    n_examples = int(next(iter(pooled.values())).shape[0]) if pooled else 0
    if n_examples < 2:
        raise InputError(f"localization needs at least 2 examples to compute a variance, got {n_examples}")
    variances = {l: pooled[l].var(dim=0, unbiased=True) for l in block_indices}
    excluded = top_magnitude(mean_abs, exclude_top_magnitude) if mean_abs is not None else {}
    neurons = select_neurons(variances, percentile, selection, seed, excluded)
    extra = {"mean_abs": mean_abs} if mean_abs is not None else {}
    return Localization(list(block_indices), neurons, variances, percentile, selection, seed, n_examples,
                        extra=extra, site=site, exclude_top_magnitude=exclude_top_magnitude, excluded=excluded,
                        block_output=block_output, tokens="all" if template is None else "content")


def localize(model: nn.Module, tokenizer, texts: Sequence[str], *, blocks: Sequence[int] | None = None,
             last_k: int = 4, percentile: float = 95.0, selection: str = "variance", seed: int = 0,
             batch_size: int = 8, max_length: int = 256, site: str = "residual",
             exclude_top_magnitude: float = 0.0, block_output: str = "block", tokens: str = "all",
             template: PromptTemplate | None = None) -> Localization:
    """Phase 1: select, in each of the chosen blocks (`blocks`, else the last `last_k`), the coordinates whose
    mask-aware mean-pooled activation has variance above the `percentile`-th percentile across `texts`.

    `site="mlp"` reads the blocks' MLP neurons instead of their output (`sites.py`); `exclude_top_magnitude=q`
    first drops each block's top q % of coordinates by mean |activation| over `texts` (0: the paper).
    Run it on forget texts for CRU, or on retain texts for the overlap control (`compare_localizations`).
    `block_output` ("block" or "hf_hidden_states"; with the latter `blocks` names HF hidden_states entries) and
    `tokens` ("all" or "content", which needs the prompt format's `template`): `readings.py`.
    """
    texts = list(texts)
    if not texts:
        raise InputError("localization got an empty text set (the forget set must not be empty)")
    percentile = validate_percentile(percentile)
    validate_exclusion(exclude_top_magnitude)
    validate_gate_site(site)
    if selection not in SELECTIONS:
        raise InputError(f"selection must be one of {', '.join(SELECTIONS)}, got {selection!r}")
    validate_choice("block_output", block_output, BLOCK_OUTPUTS)
    validate_choice("localization_tokens", tokens, LOCALIZATION_TOKENS)
    if tokens == "content" and template is None:
        raise InputError("localization_tokens=content needs the prompt format's template (readings.prompt_template)")
    if block_output == "hf_hidden_states" and site != "residual":
        raise InputError("block_output=hf_hidden_states reads the residual stream; it does not combine with "
                         f"gate_site={site!r}")
    if block_output == "hf_hidden_states":
        blocks = hf_entries_to_blocks(blocks, num_layers(model))
    block_indices = resolve_block_indices(num_layers(model), blocks, last_k)
    if site == "mlp":  # a model without a findable MLP fails here, before any forward pass
        _, decoder = find_decoder_blocks(model)
        for index in block_indices:
            mlp_down_projection(decoder[index], index)
    batches = iter_batches(tokenizer, texts, batch_size, max_length)
    return localize_batches(model, batches, block_indices=block_indices, percentile=percentile,
                            selection=selection, seed=seed, site=site, exclude_top_magnitude=exclude_top_magnitude,
                            block_output=block_output, template=template if tokens == "content" else None)


@dataclass
class BlockComparison:
    overlap: float          # |C^f ∩ C^r| / |C^f|
    spearman_rho: float     # rank correlation of the two variance vectors
    spearman_pvalue: float
    n_forget: int
    n_retain: int
    n_shared: int


def compare_localizations(forget: Localization, retain: Localization) -> dict[int, BlockComparison]:
    """Per shared block: overlap coefficient |C^f ∩ C^r| / |C^f| and Spearman rho of the variance vectors."""
    shared = [b for b in forget.block_indices if b in retain.block_indices]
    if not shared:
        raise InputError(f"the localizations share no block (forget {forget.block_indices}, "
                         f"retain {retain.block_indices})")
    result = {}
    for block in shared:
        f_set = set(forget.neurons[block].tolist())
        r_set = set(retain.neurons[block].tolist())
        rho, pvalue = stats.spearmanr(np.asarray(forget.variances[block], dtype=np.float64),
                                      np.asarray(retain.variances[block], dtype=np.float64))
        result[block] = BlockComparison(
            overlap=len(f_set & r_set) / len(f_set) if f_set else float("nan"),
            spearman_rho=float(rho), spearman_pvalue=float(pvalue),
            n_forget=len(f_set), n_retain=len(r_set), n_shared=len(f_set & r_set))
    return result
