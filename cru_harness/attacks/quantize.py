"""The quantize attack: weight-only round-to-nearest quantization of the deployed model (int8 or int4).

Source: Zhang et al. 2024, "Catastrophic Failure of LLM Unlearning via Quantization" (arXiv:2410.16454; ICLR
2025): unlearned models quantized to 4 bits recover much of the forgotten knowledge, 8 bits little, because
unlearning with a small learning rate moves weights by less than one quantization step. They quantize weights
only, with round-to-nearest (RTN) as well as GPTQ/AWQ, keeping `lm_head` in full precision; RTN is what this
attack does, so it needs no calibration data.

Library: optimum-quanto (`pip install 'cru-harness[attacks]'`). Its `qint8` (per output channel, symmetric) and
`qint4` (groups of up to 128 input weights, with a zero point) weights are computed by the same code on CPU and
GPU. torchao 0.18 was the alternative: its int8 weight-only path runs on the CPU, but `Int4WeightOnlyConfig`
needs the `mslk` GPU kernels (ImportError on a CPU machine), and bitsandbytes' 4-bit needs a GPU too.

What is evaluated: a *dequantized* checkpoint. Each quantized weight is rounded to its int8/int4 grid by quanto
and written back in the model's dtype, so the runner's lm-eval `cru` model loads an ordinary checkpoint. The
attack therefore measures exactly the weight rounding (what Zhang et al. attribute the recovery to); it does not
run quantized kernels, whose activations in higher precision would differ from these only by floating-point
rounding. Biases, norms and embeddings stay as they are.

For an adapter method (CRU) the base is quantized and the routers stay attached (`routers` of the result), as a
deployed adapter would be served on a quantized base; the routers themselves are not quantized.
"""
from __future__ import annotations

import fnmatch
import importlib
from dataclasses import dataclass, field

from ..api import Attack, CellContext, Trained
from ..errors import InputError, UserError

WEIGHT_TYPES = ("int8", "int4")
EXTRA = "attacks"


class MissingDependencyError(UserError, ImportError):
    """An optional library an attack needs is not installed."""


@dataclass
class QuantizeConfig:
    """`weights`: int8 or int4 (Zhang et al.'s two settings; 4 bits is where they find the recovery).
    `exclude`: module-name patterns (fnmatch) left in full precision; `lm_head` as in GPTQ/AWQ and Zhang et al."""
    weights: str = "int4"
    exclude: tuple[str, ...] = field(default=("lm_head",))

    def __post_init__(self):
        if self.weights not in WEIGHT_TYPES:
            raise InputError(f"weights {self.weights!r}: choose one of {', '.join(WEIGHT_TYPES)}")
        if isinstance(self.exclude, str):
            self.exclude = (self.exclude,)
        self.exclude = tuple(self.exclude)
        if not all(isinstance(p, str) and p for p in self.exclude):
            raise InputError(f"exclude must be a list of module-name patterns, got {self.exclude!r}")


def _quanto():
    try:
        quanto = importlib.import_module("optimum.quanto")
    except ImportError as err:
        raise MissingDependencyError(
            f"the quantize attack needs optimum-quanto: pip install 'cru-harness[{EXTRA}]' ({err})") from None
    return quanto


def round_weights(model, config: QuantizeConfig) -> dict:
    """Round every linear weight of `model` (but `config.exclude`) through quanto's int8/int4 grid and back, in
    place. Returns what was done: the modules, their group sizes and the weights' relative change."""
    import torch

    quanto = _quanto()
    qtype = {"int8": quanto.qint8, "int4": quanto.qint4}[config.weights]
    names, group_sizes, change, norm, tied = [], set(), 0.0, 0.0, []
    # a head tied to the input embedding shares its storage: rounding it would round the embedding too, which a
    # quantized runtime keeps in full precision; such a head is left as it is (and named in the record)
    embeddings = {m.weight.data_ptr() for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or any(fnmatch.fnmatch(name, p) for p in config.exclude):
                continue
            if module.weight.data_ptr() in embeddings:
                tied.append(name)
                continue
            # one module at a time (quanto copies it), so the model is never held twice
            quantized = quanto.quantize_module(module, weights=qtype)
            quantized.freeze()
            rounded = quantized.qweight.dequantize().to(module.weight.dtype)
            group_sizes.add(quantized.weight_group_size)
            delta = (rounded.float() - module.weight.float())
            change += float(delta.pow(2).sum())
            norm += float(module.weight.float().pow(2).sum())
            module.weight.copy_(rounded)
            names.append(name)
            del quantized
    if not names:
        raise InputError(f"quantize: no linear layer left to quantize (exclude={list(config.exclude)})")
    return {"library": f"optimum-quanto {_version()}", "weights": config.weights, "exclude": list(config.exclude),
            "n_modules": len(names), "tied_to_embedding_left": tied,
            "group_sizes": sorted(str(g) if g else "per output channel" for g in group_sizes),
            "relative_weight_change": (change / norm) ** 0.5 if norm else 0.0,
            "checkpoint": "dequantized (weights rounded to the grid and stored in the model's dtype)"}


def _version() -> str:
    from importlib.metadata import version

    return version("optimum-quanto")


class QuantizeAttack(Attack):
    name = "quantize"
    summary = "weight-only int8/int4 round-to-nearest (optimum-quanto), evaluated as a dequantized checkpoint"
    config = QuantizeConfig
    order = 120
    needs_one_checkpoint = True   # no cell for a WHP model (two checkpoints)

    def run(self, ctx: CellContext) -> Trained:
        config = QuantizeConfig(**ctx.cell.extra["attack"]["settings"])
        _quanto()    # a missing library is reported before the model is loaded
        model, tokenizer = ctx.load_model(ctx.model_path)
        details = round_weights(model, config)
        details["routers_kept"] = ctx.routers
        out = ctx.workdir / "quantized"
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        ctx.outcome["details"]["quantize"] = details
        return Trained(str(out), routers=ctx.routers)


ATTACK = QuantizeAttack()
