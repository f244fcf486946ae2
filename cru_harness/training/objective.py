"""What the training engine trains: a config (`TrainingConfig`) and an objective (`Objective`).

An objective gives its loss (`compute_loss(model, batch, ref_model) -> (loss, logs)` over a batch's sub-batches:
"forget" / "retain" / "alternate", or "train" for fine-tuning), which weights it trains
(`trainable_parameters`), whether it needs a frozen reference model (`needs_ref`), and optional hooks, each with
a default that changes nothing: `prepare(model, seed, dataset)` (per-run state before the first step),
`fit(...)` (a method trained by its own steps on the engine, LUNAR), `group_counts(key, inputs)` (the counts a
loss normalises by, summed by the engine over an accumulation group), `make_scheduler` and
`post_train(model, ref_model)`. The engine (`engine.py`) owns devices, precision, accumulation and distribution.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch

from ..errors import InputError
from ..hparams import adam_betas_problem, fields_problem

#: Hugging Face's label value the loss ignores (prompt tokens and padding).
IGNORE_INDEX = -100


def default_counts(inputs: dict) -> dict[str, torch.Tensor]:
    """A sub-batch's counts: answer tokens scored (`tokens`), rows (`seqs`), positions of the rows' real tokens
    (`positions`: prompt and answer, not padding)."""
    labels = inputs["labels"]
    return {"tokens": (labels[:, 1:] != IGNORE_INDEX).sum(), "seqs": torch.tensor(labels.shape[0]),
            "positions": inputs["attention_mask"].sum()}


SCHEDULERS = ("linear", "cosine", "constant")
MIXED_PRECISION = ("no", "fp16", "bf16")
#: How the trained weights are held: fp32 master weights and AdamW state (under the run's autocast), or bf16 weights,
#: gradients and AdamW state stepped directly, as WMDP's RMU and open-unlearning's bf16 runs train.
PRECISIONS = ("fp32_master", "bf16")


@dataclass
class TrainingConfig:
    """The engine's hyperparameters: optimizer, schedule, batches, precision (every weight-training method's
    config subclasses it; a benchmark's defaults for a method: `with_defaults`)."""

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
    precision: str = "fp32_master"      # fp32_master | bf16: bf16 weights and AdamW state, no fp32 copy (PRECISIONS)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8

    def __post_init__(self):
        if self.lr_scheduler not in SCHEDULERS:
            raise InputError(f"lr_scheduler {self.lr_scheduler!r}: choose one of {', '.join(SCHEDULERS)}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise InputError(f"mixed_precision {self.mixed_precision!r}: choose one of {', '.join(MIXED_PRECISION)}")
        if self.precision not in PRECISIONS:
            raise InputError(f"precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if self.precision == "bf16" and self.mixed_precision != "no":
            raise InputError(f"precision bf16 computes in its bf16 weights, without autocast: leave mixed_precision "
                             f"'no' (got {self.mixed_precision!r})")
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
    def with_defaults(cls, defaults: Mapping[str, Any] | None = None, **overrides) -> "TrainingConfig":
        """A benchmark's defaults for the method (`api.Benchmark.method_defaults`, which
        `baselines.make_config` asks), then overrides. No defaults: the dataclass's own (TOFU's protocol)."""
        values = dict(defaults or {})
        if "warmup_epochs" in overrides and "warmup_steps" not in overrides:
            values.pop("warmup_steps", None)   # a warm-up given in epochs replaces a default in steps (RWKU's 20)
        values.update(overrides)
        return cls.from_dict(values)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainingConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise InputError(f"{cls.__name__}: unknown option(s) {unknown}; valid: {sorted(names)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["adam_betas"] = list(d["adam_betas"])
        return d



class Objective:
    """What a weight-training method gives the engine; subclasses set `name`, `Config` and implement
    `compute_loss`."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = TrainingConfig
    needs_ref: ClassVar[bool] = False

    def __init__(self, config: TrainingConfig | dict | None = None):
        if config is None:
            config = self.Config()
        elif isinstance(config, dict):
            config = self.Config.from_dict(config)
        elif not isinstance(config, self.Config):
            raise TypeError(f"{self.name}: config must be a {self.Config.__name__} or a dict, "
                            f"got {type(config).__name__}")
        self.config = config

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
        return default_counts(inputs)
