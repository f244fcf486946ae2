"""LoRA (PEFT) as an option of every method that trains weights: `lora: {r, alpha, dropout, target_modules}` in a
method entry of a runner config, `--lora-r/--lora-alpha/--lora-dropout/--lora-target-modules` (or `--lora rwku`)
on `cru-harness unlearn` and `finetune`.

The base stays frozen in the run's dtype (a bf16 8B model: 16 GB, not 32 GB of fp32 master weights); the adapter
trains in fp32 under the run's autocast. The reference model of NPO / SimNPO / IdkDPO / DPO / the KL variants is
the same model with its adapter switched off (`AdapterOff`): no second copy of the base. The result is saved as a
PEFT adapter directory, which `lm_eval --model hf --model_args pretrained=BASE,peft=ADAPTER` and `--model cru`
load, and the runner evaluates that way.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import InputError

def lora_presets() -> dict[str, dict[str, Any]]:
    """The LoRA settings the registered benchmarks' reference runs use (`api.Benchmark.lora_preset`), by benchmark
    name: `lora: {preset: NAME}` in a config, `--lora NAME` on a command."""
    from .. import plugins

    return {b.name: dict(preset) for b in plugins.benchmarks if (preset := b.lora_preset()) is not None}


@dataclass(frozen=True)
class LoraSettings:
    """A LoRA adapter's shape; validates itself as PEFT's `LoraConfig` does (and through it).
    `target_modules`: module names (None: PEFT's default for the architecture, e.g. q_proj, v_proj on Llama)."""

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] | None = None

    def __post_init__(self):
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise InputError(f"lora.r {self.r!r}: expected an integer >= 1")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise InputError(f"lora.alpha {self.alpha!r}: expected a number > 0")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0 <= self.dropout < 1:
            raise InputError(f"lora.dropout {self.dropout!r}: expected a number in [0, 1)")
        targets = self.target_modules
        if isinstance(targets, str):
            targets = tuple(t.strip() for t in targets.split(",") if t.strip())
        if targets is not None:
            targets = tuple(targets)
            if not targets or not all(isinstance(t, str) and t for t in targets):
                raise InputError(f"lora.target_modules {self.target_modules!r}: expected module names")
        object.__setattr__(self, "target_modules", targets)
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "dropout", float(self.dropout))

    @classmethod
    def from_dict(cls, values: dict | str | "LoraSettings" | None) -> "LoraSettings":
        """From a config's mapping, `{preset: rwku, ...overrides}`, or a preset name."""
        if isinstance(values, LoraSettings):
            return values
        if isinstance(values, str):
            values = {"preset": values}
        if not isinstance(values, dict):
            raise InputError(f"lora: expected a mapping {{r, alpha, dropout, target_modules}}, got {values!r}")
        values = dict(values)
        preset = values.pop("preset", None)
        if preset is not None:
            presets = lora_presets()
            if preset not in presets:
                valid = ", ".join(presets) or "none (no registered benchmark publishes one)"
                raise InputError(f"lora.preset {preset!r}: choose one of {valid}")
            values = {**presets[preset], **values}
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise InputError(f"lora: unknown key(s) {unknown}; valid: preset, r, alpha, dropout, target_modules")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["target_modules"] = list(self.target_modules) if self.target_modules is not None else None
        return d

    def peft_config(self):
        """PEFT's `LoraConfig` of these settings (a causal LM)."""
        try:
            from peft import LoraConfig, TaskType
        except ImportError:
            raise InputError("LoRA needs PEFT: pip install 'cru-harness[peft]'") from None
        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=list(self.target_modules) if self.target_modules else None,
                          task_type=TaskType.CAUSAL_LM)


def add_lora(model: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    """`model` with a fresh LoRA adapter (PEFT's `get_peft_model`): the base frozen, the adapter trainable, in
    fp32 whatever the base's dtype. A target PEFT cannot find on this model is an `InputError`."""
    from peft import get_peft_model

    try:
        return get_peft_model(model, settings.peft_config(), autocast_adapter_dtype=True)
    except ValueError as err:   # e.g. "Target modules {...} not found in the base model"
        raise InputError(f"lora: {err}") from None


def check_lora_method(method) -> None:
    """A method that picks its own weights (RMU, LUNAR), fits them itself or edits the whole model after training
    (Task Vector) has no adapter to train: refused with LoRA."""
    from .objective import Objective

    own = [hook for hook in ("trainable_parameters", "fit", "post_train")
           if getattr(type(method), hook) is not getattr(Objective, hook)]
    if own:
        raise InputError(f"{method.name} with lora: it sets its own {' and '.join(own)}, which an adapter does not "
                         "have; train it without lora")


def is_lora(model: torch.nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


class AdapterOff(torch.nn.Module):
    """The frozen reference of a LoRA run: the trained model with its adapter switched off, i.e. the starting
    model, without a copy of it. Called as a model (`ref(input_ids=..., attention_mask=...)`)."""

    def __init__(self, peft_model: torch.nn.Module):
        super().__init__()
        self._peft = [peft_model]   # a list: not a submodule, so `.parameters()` is empty (nothing to freeze)

    def forward(self, *args, **kwargs):
        model = self._peft[0]
        was_training = model.training
        model.eval()   # as a frozen reference runs: no dropout
        try:
            with torch.no_grad(), model.disable_adapter():
                return model(*args, **kwargs)
        finally:
            model.train(was_training)

    def eval(self):   # the trained model's mode is the loop's business
        return self

    def to(self, *args, **kwargs):
        return self


def add_training_arguments(parser) -> None:
    """`--lora PRESET`, `--lora-r`, `--lora-alpha`, `--lora-dropout`, `--lora-target-modules`,
    `--gradient-checkpointing` (on `unlearn` and `finetune`)."""
    group = parser.add_argument_group("LoRA and memory (methods that train weights)")
    group.add_argument("--lora", default=None, metavar="BENCHMARK",
                       help="train a LoRA adapter with the settings a benchmark's reference runs use (RWKU's: r 8, "
                            "alpha 16, q_proj,v_proj)")
    group.add_argument("--lora-r", type=int, default=None, help="train a LoRA adapter of this rank (PEFT)")
    group.add_argument("--lora-alpha", type=float, default=None, help="LoRA's scale alpha (default 16)")
    group.add_argument("--lora-dropout", type=float, default=None, help="LoRA's dropout (default 0)")
    group.add_argument("--lora-target-modules", default=None, metavar="NAMES",
                       help="comma-separated module names the adapter wraps (default: PEFT's for the architecture)")
    group.add_argument("--gradient-checkpointing", action="store_true",
                       help="recompute activations in the backward pass (less memory, about a third slower)")


def lora_from_args(args) -> LoraSettings | None:
    """The `--lora*` flags as settings, or None when none is given (full-weight training)."""
    given = {key: getattr(args, f"lora_{key}", None) for key in ("r", "alpha", "dropout", "target_modules")}
    given = {k: v for k, v in given.items() if v is not None}
    preset = getattr(args, "lora", None)
    if preset is None and not given:
        return None
    return LoraSettings.from_dict({**({"preset": preset} if preset else {}), **given})
