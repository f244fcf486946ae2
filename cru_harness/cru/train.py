"""Phase 2 of CRU: train one router per selected block on gate values only (`cru_method.md`, "Phase 2").

    L = mean_l(mean forget gate) + lam * mean_l((mean retain gate - 1)^2)

with the means taken jointly over the selected coordinates and the non-padding positions. The base is frozen
(no parameter of it requires grad, the optimizer only holds router parameters) and the forward stops after the
last gated block, so the LM head never runs while routers train.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn
from tqdm.auto import tqdm

from ..context import fit_to_context
from .attach import attach_bundles
from .blocks import find_decoder_blocks, run_until
from .bundle import BundleConfig, RouterBundle, base_fingerprint
from .localize import (SELECTIONS, Batch, Localization, _input_device, collate, localize, pad_token_id,
                       tokenize_texts, validate_percentile)
from .router import INPUT_NORMS, Router


@dataclass
class RouterTrainingConfig:
    """Hyper-parameters of `train_routers` (defaults follow the TOFU setting of `cru_method.md`)."""
    last_k: int = 4
    blocks: list[int] | None = None
    percentile: float = 95.0
    selection: str = "variance"     # "variance" (CRU) or "random" (control: same blocks, same |C_l|)
    d_r: int = 32
    lam: float = 1.0
    epochs: int = 5
    lr: float = 1e-3
    batch_size: int = 8
    max_length: int = 256
    seed: int = 0
    input_norm: str = "none"        # "rms": router reads h / rms(h); see Router
    forget_description: str = ""    # recorded in the manifest (e.g. "tofu:forget10")
    retain_description: str = ""
    progress: bool = True

    def __post_init__(self):
        validate_percentile(self.percentile)
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)}, got {self.selection!r}")
        if self.input_norm not in INPUT_NORMS:
            raise ValueError(f"input_norm must be one of {', '.join(INPUT_NORMS)}, got {self.input_norm!r}")
        for name in ("d_r", "epochs", "batch_size", "max_length"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr!r}")
        if not self.lam >= 0:
            raise ValueError(f"lam (lambda) must be non-negative, got {self.lam!r}")


class _GateRecorder:
    """Collects, per forward pass, each block's masked gate sum and count (for the means of the loss)."""

    def __init__(self):
        self.mask: torch.Tensor | None = None
        self.sums: dict[int, torch.Tensor] = {}
        self.counts: dict[int, float] = {}

    def reset(self, mask: torch.Tensor) -> None:
        self.mask, self.sums, self.counts = mask, {}, {}

    def __call__(self, block: int, _bundle, gates: torch.Tensor) -> None:
        mask = self.mask.to(gates.device, torch.float32).unsqueeze(-1)
        self.sums[block] = (gates * mask).sum()
        self.counts[block] = float(mask.sum()) * gates.shape[-1]

    def block_means(self) -> dict[int, torch.Tensor]:
        return {block: self.sums[block] / self.counts[block] for block in self.sums}


def gate_means(model: nn.Module, bundle: RouterBundle, batch: Batch, recorder: _GateRecorder | None = None
               ) -> dict[int, torch.Tensor]:
    """Mean gate per gated block over the batch's non-padding positions and the selected coordinates.

    Runs the model only up to the last gated block. `bundle` must already be attached with `recorder` as its
    observer when `recorder` is given; otherwise it is attached for this call.
    """
    _, blocks = find_decoder_blocks(model)
    handle = None
    if recorder is None:
        recorder = _GateRecorder()
        handle = attach_bundles(model, [bundle], observer=recorder)
    try:
        batch = batch.to(_input_device(model))
        recorder.reset(batch.attention_mask)
        run_until(model, blocks, max(bundle.block_indices),
                  input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        return recorder.block_means()
    finally:
        if handle is not None:
            handle.remove()


def cru_loss(forget_means: dict[int, torch.Tensor], retain_means: dict[int, torch.Tensor], lam: float
             ) -> torch.Tensor:
    """`mean_l(forget gate mean) + lam * mean_l((retain gate mean - 1)^2)`."""
    suppress = torch.stack(list(forget_means.values())).mean()
    keep = torch.stack([(m - 1.0) ** 2 for m in retain_means.values()]).mean()
    return suppress + lam * keep


def _fingerprint_texts(texts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _base_name(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "_name_or_path", "") or getattr(model, "name_or_path", "") or type(model).__name__)


def new_bundle(model: nn.Module, localization: Localization, config: RouterTrainingConfig) -> RouterBundle:
    """Freshly initialised routers (seeded) for the blocks and coordinates of `localization`."""
    fingerprint = base_fingerprint(model)
    bundle_config = BundleConfig(
        base_model=_base_name(model), fingerprint=fingerprint, block_indices=list(localization.block_indices),
        neurons={b: localization.neurons[b].tolist() for b in localization.block_indices},
        d_r=config.d_r, percentile=float(config.percentile), lam=float(config.lam), seed=config.seed,
        selection=config.selection, input_norm=config.input_norm,
        base_parameters=sum(p.numel() for p in model.parameters()))
    torch.manual_seed(config.seed)
    routers = {b: Router(fingerprint["hidden_size"], len(bundle_config.neurons[b]), config.d_r,
                         input_norm=config.input_norm) for b in localization.block_indices}
    bundle = RouterBundle(bundle_config, routers)
    bundle_config.router_parameters = bundle.num_router_parameters()
    return bundle


@torch.no_grad()
def measure_gate_means(model: nn.Module, tokenizer, bundle: RouterBundle, texts: Sequence[str], *,
                       batch_size: int = 8, max_length: int = 256) -> dict:
    """Mean gate over all `texts` (eval mode): overall and per block, weighted by non-padding tokens."""
    ids = tokenize_texts(tokenizer, texts, max_length)
    pad = pad_token_id(tokenizer)
    recorder = _GateRecorder()
    sums = {b: 0.0 for b in bundle.block_indices}
    counts = {b: 0.0 for b in bundle.block_indices}
    was_training = bundle.training
    bundle.eval()
    handle = attach_bundles(model, [bundle], observer=recorder)
    try:
        for start in range(0, len(ids), batch_size):
            gate_means(model, bundle, collate(ids[start:start + batch_size], pad), recorder)
            for b in bundle.block_indices:
                sums[b] += float(recorder.sums[b])
                counts[b] += recorder.counts[b]
    finally:
        handle.remove()
        bundle.train(was_training)
    per_block = {str(b): sums[b] / counts[b] for b in bundle.block_indices}
    return {"mean": sum(per_block.values()) / len(per_block), "per_block": per_block}


def train_routers(model: nn.Module, tokenizer, forget_texts: Sequence[str], retain_texts: Sequence[str],
                  config: RouterTrainingConfig | None = None, *, localization: Localization | None = None
                  ) -> RouterBundle:
    """Localize on `forget_texts` (unless `localization` is given), then train one router per selected block so
    gates close on forget inputs and stay open on retain inputs. Returns the trained `RouterBundle`, whose
    `config.metrics` holds the final forget/retain gate means measured over both corpora in eval mode.

    The base model's parameters are never updated; their `requires_grad` flags are restored afterwards.
    """
    config = config or RouterTrainingConfig()
    forget_texts, retain_texts = list(forget_texts), list(retain_texts)
    if not forget_texts:
        raise ValueError("the forget set is empty; CRU needs examples of what to forget")
    if not retain_texts:
        raise ValueError("the retain set is empty; CRU needs examples of what to keep")
    max_length = fit_to_context(model, config.max_length, lambda: {
        side: [len(ids) for ids in tokenize_texts(tokenizer, texts, config.max_length)]
        for side, texts in (("forget", forget_texts), ("retain", retain_texts))})
    if localization is None:
        localization = localize(model, tokenizer, forget_texts, blocks=config.blocks, last_k=config.last_k,
                                percentile=config.percentile, selection=config.selection, seed=config.seed,
                                batch_size=config.batch_size, max_length=max_length)
    bundle = new_bundle(model, localization, config)

    forget_ids = tokenize_texts(tokenizer, forget_texts, max_length)
    retain_ids = tokenize_texts(tokenizer, retain_texts, max_length)
    pad = pad_token_id(tokenizer)
    generator = torch.Generator().manual_seed(config.seed)
    steps_per_epoch = math.ceil(len(forget_ids) / config.batch_size)
    total_steps = steps_per_epoch * config.epochs

    # Freeze the base: no gradient, no optimizer state for any of its parameters.
    requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
    for param in model.parameters():
        param.requires_grad_(False)
    model_was_training = model.training
    model.eval()  # dropout off: the base is evaluated, not trained
    bundle.train()
    optimizer = torch.optim.Adam(bundle.routers.parameters(), lr=config.lr)
    recorder = _GateRecorder()
    handle = attach_bundles(model, [bundle], observer=recorder)
    retain_order: list[int] = []
    loss_value, forget_mean, retain_mean = float("nan"), float("nan"), float("nan")
    progress = tqdm(total=total_steps, desc="CRU routers", disable=not config.progress, leave=False)
    try:
        for _epoch in range(config.epochs):
            forget_order = torch.randperm(len(forget_ids), generator=generator).tolist()
            for start in range(0, len(forget_order), config.batch_size):
                forget_batch = collate([forget_ids[i] for i in forget_order[start:start + config.batch_size]], pad)
                # Retain batches cycle through their own shuffled order, independent of the forget set's size.
                take = []
                while len(take) < min(config.batch_size, len(retain_ids)):
                    if not retain_order:
                        retain_order = torch.randperm(len(retain_ids), generator=generator).tolist()
                    take.append(retain_order.pop(0))
                retain_batch = collate([retain_ids[i] for i in take], pad)

                forget_means = gate_means(model, bundle, forget_batch, recorder)
                retain_means = gate_means(model, bundle, retain_batch, recorder)
                loss = cru_loss(forget_means, retain_means, config.lam)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()

                loss_value = loss.item()
                forget_mean = torch.stack(list(forget_means.values())).mean().item()
                retain_mean = torch.stack(list(retain_means.values())).mean().item()
                progress.set_postfix(forget=f"{forget_mean:.3f}", retain=f"{retain_mean:.3f}",
                                     loss=f"{loss_value:.3f}")
                progress.update(1)
    finally:
        progress.close()
        handle.remove()
        for name, param in model.named_parameters():
            param.requires_grad_(requires_grad.get(name, param.requires_grad))
        model.train(model_was_training)
    bundle.eval()

    forget_final = measure_gate_means(model, tokenizer, bundle, forget_texts, batch_size=config.batch_size,
                                      max_length=max_length)
    retain_final = measure_gate_means(model, tokenizer, bundle, retain_texts, batch_size=config.batch_size,
                                      max_length=max_length)
    bundle.config.metrics = {
        "forget_gate_mean": forget_final["mean"], "retain_gate_mean": retain_final["mean"],
        "forget_gate_mean_per_block": forget_final["per_block"],
        "retain_gate_mean_per_block": retain_final["per_block"],
        "final_loss": loss_value, "last_batch_forget_gate_mean": forget_mean,
        "last_batch_retain_gate_mean": retain_mean, "steps": total_steps,
    }
    bundle.config.training = {k: v for k, v in asdict(config).items()
                              if k not in ("progress", "forget_description", "retain_description")}
    bundle.config.training_data = {
        "forget": {"description": config.forget_description, "n_examples": len(forget_texts),
                   "sha256_16": _fingerprint_texts(forget_texts)},
        "retain": {"description": config.retain_description, "n_examples": len(retain_texts),
                   "sha256_16": _fingerprint_texts(retain_texts)},
        "localization_examples": localization.n_examples,
    }
    return bundle
