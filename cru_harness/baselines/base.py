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

Presets: `Config.preset(benchmark, split, **overrides)` merges the benchmark's defaults, then the split's,
then the overrides. TOFU defaults are the protocol's (lr 1e-5, weight decay 0.01, AdamW, 1 warmup epoch
with linear warmup and decay, effective batch 32, 5 epochs); RWKU defaults follow RWKU's LLaMA-Factory scripts
(scripts/full/run_{ga,npo,dpo}.sh: cosine schedule, 20 warmup steps, 3 epochs, cutoff 512, LLaMA-Factory's
weight decay 0, per-method lr / batch / beta). Those were tuned for 8B models: a tiny model needs its own
learning rate, which an experiment config states.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..errors import InputError
from ..hparams import adam_betas_problem, fields_problem

SCHEDULERS = ("linear", "cosine", "constant")
MIXED_PRECISION = ("no", "fp16", "bf16")


@dataclass
class BaselineConfig:
    """Training hyperparameters common to every trained baseline."""

    learning_rate: float = 1e-5
    weight_decay: float = 0.01
    num_epochs: int = 5
    warmup_epochs: float = 1.0          # linear warmup over this many epochs...
    warmup_steps: int | None = None     # ...unless a step count is given (RWKU: 20)
    lr_scheduler: str = "linear"        # decay after warmup: linear | cosine | constant
    effective_batch_size: int = 32      # a multiple of micro_batch_size, over all processes
    micro_batch_size: int = 4
    max_length: int = 512
    max_grad_norm: float | None = 1.0   # HF Trainer's default clipping, which TOFU's code ran with
    mixed_precision: str = "no"         # no | fp16 | bf16 (autocast through accelerate)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8

    _PRESETS: ClassVar[dict[tuple[str, str | None], dict[str, Any]]] = {
        ("rwku", None): dict(num_epochs=3, lr_scheduler="cosine", warmup_steps=20, weight_decay=0.0,
                             max_length=512),
        # WMDP's protocol rule: every passage-training method gets RMU's data budget and schedule (one pass over
        # the benchmark's 600 forget passages in batches of 4, constant rate, no warm-up or weight decay, 512
        # tokens, WMDP's rmu/unlearn.py); its learning rate is the one the baselines' one-rate rule picks
        # (docs/methods.md)
        ("wmdp", None): dict(num_epochs=1, effective_batch_size=4, micro_batch_size=4, lr_scheduler="constant",
                             warmup_epochs=0.0, warmup_steps=None, weight_decay=0.0, max_length=512),
    }

    def __post_init__(self):
        if self.lr_scheduler not in SCHEDULERS:
            raise InputError(f"lr_scheduler {self.lr_scheduler!r}: choose one of {', '.join(SCHEDULERS)}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise InputError(f"mixed_precision {self.mixed_precision!r}: choose one of {', '.join(MIXED_PRECISION)}")
        # Every numeric field, a subclass's (alpha, beta, ...) too, by the runner config's table (kept there,
        # torch-free, so validating a config imports no torch): a config, `cru-harness finetune` and this API
        # refuse the same values. Weight decay, for one, reaches AdamW per parameter group, unchecked by torch.
        if problem := fields_problem(self):
            raise InputError(problem)
        if problem := adam_betas_problem(self.adam_betas):
            raise InputError(f"adam_betas: {problem}")
        self.adam_betas = tuple(self.adam_betas)

    def micro_batches_per_step(self) -> int:
        """The micro-batches of one optimizer step, over all processes."""
        if self.effective_batch_size % self.micro_batch_size:
            raise InputError(f"effective_batch_size {self.effective_batch_size} is not a multiple of "
                             f"micro_batch_size {self.micro_batch_size}")
        return self.effective_batch_size // self.micro_batch_size

    def gradient_accumulation_steps(self, num_processes: int = 1) -> int:
        """The micro-batches a process accumulates in a step: the step's are dealt out among the processes (the
        most one gets, when the count does not divide them)."""
        per_step = self.micro_batches_per_step()
        if num_processes > per_step:   # a process would compute nothing in every step
            raise InputError(f"{num_processes} processes for {per_step} micro-batches a step (effective_batch_size "
                             f"{self.effective_batch_size} / micro_batch_size {self.micro_batch_size}): lower "
                             "micro_batch_size or the process count")
        return -(-per_step // num_processes)

    @classmethod
    def preset(cls, benchmark: str = "tofu", split: str | None = None, **overrides) -> "BaselineConfig":
        """Defaults for a benchmark (and split, where the method's defaults depend on it), then overrides. A
        benchmark the method has no preset for (a plugin's) trains with the dataclass's defaults: TOFU's protocol."""
        values: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):  # base presets first, the method's own last
            presets = klass.__dict__.get("_PRESETS", {})
            values.update(presets.get((benchmark, None), {}))
        for klass in reversed(cls.__mro__):
            presets = klass.__dict__.get("_PRESETS", {})
            values.update(presets.get((benchmark, split), {}) if split is not None else {})
        cls._check_split(benchmark, split)
        if "warmup_epochs" in overrides and "warmup_steps" not in overrides:
            values.pop("warmup_steps", None)   # a warm-up given in epochs replaces a preset's in steps (RWKU's 20)
        values.update(overrides)
        return cls.from_dict(values)

    @classmethod
    def _check_split(cls, benchmark: str, split: str | None) -> None:
        """Methods whose defaults depend on the split override this to reject splits they have none for."""

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "BaselineConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise InputError(f"{cls.__name__}: unknown option(s) {unknown}; valid: {sorted(names)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["adam_betas"] = list(d["adam_betas"])
        return d


@dataclass
class RetainConfig(BaselineConfig):
    """A method with a retain term: loss = forget_weight * forget_term + alpha * NLL(retain)."""

    alpha: float = 1.0
    forget_weight: float = 1.0


class UnlearningMethod:
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

    def __init__(self, config: BaselineConfig | dict | None = None):
        if config is None:
            config = self.Config()
        elif isinstance(config, dict):
            config = self.Config.from_dict(config)
        elif not isinstance(config, self.Config):
            raise TypeError(f"{self.name}: config must be a {self.Config.__name__} or a dict, "
                            f"got {type(config).__name__}")
        self.config = config

    @property
    def uses_retain(self) -> bool:
        return getattr(self.config, "alpha", 0.0) > 0

    def compute_loss(self, model, batch: dict, ref_model=None) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def trained_weights(self) -> str:
        """What `trainable_parameters` trains, in words, for `--dry-run` (no model needed)."""
        return "all weights"

    def trainable_parameters(self, model) -> list[str] | None:
        """Names (as `model.named_parameters()` gives them) of the only parameters this method trains; None: all.
        The trainer freezes the others before building the optimizer (and leaves them frozen)."""
        return None

    def prepare(self, model, seed: int, dataset=None) -> None:
        """Called once by the trainer before the first step (after seeding), with the training dataset
        (`data.ForgetRetainDataset`): draw or compute per-run state here."""

    def make_dataset(self, tokenizer, forget_rows: list[dict], retain_rows: list[dict], **kwargs):
        """The training dataset (`data.ForgetRetainDataset`, keyword arguments as its): RMU reads a joint unit's
        domain-tagged rows in WMDP's alternating batches (`data.DomainAlternatingDataset`)."""
        from .data import ForgetRetainDataset

        return ForgetRetainDataset(tokenizer, forget_rows, retain_rows, **kwargs)

    def fit(self, model, dataset, *, seed: int, progress: bool):
        """A method that is not trained by the trainer's loop over batches of rows returns its own
        `trainer.TrainResult` here, after `prepare` (LUNAR fits one projection on cached activations); None:
        the trainer's loop trains it with `compute_loss`."""
        return None

    def post_train(self, model, ref_model=None) -> None:
        """Called once by the trainer after the last step, on the unwrapped model (no gradients): a final edit of
        the weights (Task Vector's arithmetic)."""

    def make_scheduler(self, optimizer, total_steps: int, warmup_steps: int, steps_per_epoch: float):
        """A learning-rate schedule of the method's own (stepped once per optimizer step), or None for the config's
        `lr_scheduler`."""
        return None

    def group_counts(self, key: str, inputs: dict) -> dict[str, torch.Tensor]:
        """The counts of sub-batch `key` (forget / retain / alternate) a loss divides by. The trainer sums each
        over an accumulation group and hands the sums back as `inputs["group_<name>"]` (see `losses.py`):
        `tokens` (answer tokens scored), `seqs` (rows), `positions` (positions predicting a real token)."""
        from .losses import default_counts

        return default_counts(inputs)

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
