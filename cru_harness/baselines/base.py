"""Base config and method classes shared by every baseline.

A method is a class with a `Config` dataclass (its hyperparameters, the protocol's TOFU defaults), flags
saying what it needs (`needs_ref`, `needs_retain`, `needs_alternate`, `trains`), and
`compute_loss(model, batch, ref_model=None) -> (loss, logs)`. `batch` maps "forget" / "retain" /
"alternate" to tokenised sub-batches (see `data.ForgetRetainDataset`).

Extension points, each with a default that changes nothing: `retain_loss` ("nll", or "kl" to the frozen
reference), `trainable_parameters(model)` (the names of the only parameters trained, e.g. RMU's few MLP
weights), `prepare(model, seed, dataset)` (state computed once per run before the first step, e.g. RMU's random
direction), `group_counts(key, inputs)` (the counts a loss normalises by, summed by the trainer over an
accumulation group), `make_scheduler` (a learning-rate schedule of the method's own, e.g. LUNAR's) and
`post_train(model, ref_model)` (a last edit of the weights after training, e.g. Task Vector's negation).

Defaults: the dataclasses' are TOFU's protocol (lr 1e-5, weight decay 0.01, AdamW, 1 warmup epoch with linear
warmup and decay, effective batch 32, 5 epochs). Another benchmark's settings of a method live in its package
(`api.Benchmark.method_defaults`); `make_config(name, benchmark, split, **overrides)` puts the overrides on them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import InputError
from ..training.objective import MIXED_PRECISION, SCHEDULERS, Objective, TrainingConfig  # noqa: F401

@dataclass
class BaselineConfig(TrainingConfig):
    """Training hyperparameters common to every trained baseline (the engine's `TrainingConfig`); a benchmark's
    defaults for a method come from its plugin (`api.Benchmark.method_defaults`, through `make_config`)."""


@dataclass
class RetainConfig(BaselineConfig):
    """A method with a retain term: loss = forget_weight * forget_term + alpha * NLL(retain)."""

    alpha: float = 1.0
    forget_weight: float = 1.0


class UnlearningMethod(Objective):
    """Base class; subclasses set `name`, `Config`, the flags, and implement `compute_loss`."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = BaselineConfig
    trains: ClassVar[bool] = True
    needs_ref: ClassVar[bool] = False
    needs_retain: ClassVar[bool] = False     # True: retain rows are required (if alpha > 0)
    needs_alternate: ClassVar[bool] = False  # True: a refusal per forget item (IdkDPO)
    #: The retain term `_retain_term` adds: "nll" (token-mean NLL of the retain answers) or "kl"
    #: (`losses.kl_to_reference`: KL(reference || model) over the retain rows' positions; needs_ref).
    retain_loss: ClassVar[str] = "nll"

    @property
    def uses_retain(self) -> bool:
        return getattr(self.config, "alpha", 0.0) > 0

    def make_dataset(self, tokenizer, forget_rows: list[dict], retain_rows: list[dict], **kwargs):
        """The training dataset (`data.ForgetRetainDataset`, keyword arguments as its): RMU reads a joint unit's
        domain-tagged rows in WMDP's alternating batches (`data.DomainAlternatingDataset`)."""
        from .data import ForgetRetainDataset

        return ForgetRetainDataset(tokenizer, forget_rows, retain_rows, **kwargs)

    def _retain_batch(self, batch: dict) -> dict:
        """The batch's retain examples, which a method with a retain term (alpha > 0) cannot run without."""
        if "retain" not in batch:
            raise InputError(f"{self.name}: alpha={self.config.alpha} but the batch has no retain examples "
                             "(pass retain rows, or set alpha=0)")
        return batch["retain"]

    def _retain_term(self, model, batch: dict, logs: dict, ref_model=None) -> torch.Tensor | float:
        if not self.uses_retain:
            return 0.0
        retain = self._retain_batch(batch)
        from .losses import kl_to_reference, nll_loss

        if self.retain_loss == "kl":
            term, logs["retain_kl"] = kl_to_reference(model, ref_model, retain)
        else:
            term, logs["retain_nll"] = nll_loss(model, retain)
        return self.config.alpha * term
