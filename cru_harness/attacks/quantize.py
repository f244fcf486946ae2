"""The quantize attack: weight-only round-to-nearest quantization of the deployed model (int8 or int4).

Source: Zhang et al. 2024, "Catastrophic Failure of LLM Unlearning via Quantization" (arXiv:2410.16454; ICLR
2025): unlearned models quantized to 4 bits recover much of the forgotten knowledge, 8 bits little, because
unlearning with a small learning rate moves weights by less than one quantization step. They quantize weights
only, with round-to-nearest (RTN) as well as GPTQ/AWQ, keeping `lm_head` in full precision; RTN is what this
attack does, so it needs no calibration data.

Libraries (`pip install 'cru-harness[attacks]'`), the `library` setting:
- `optimum-quanto` (default): `qint8` (per output channel, symmetric) and `qint4` (groups of up to 128 input
  weights, with a zero point), computed by the same code on CPU and GPU. torchao 0.18 was the alternative: its int8
  weight-only path runs on the CPU, but `Int4WeightOnlyConfig` needs the `mslk` GPU kernels (ImportError on a CPU
  machine).
- `bitsandbytes`: Zhang et al.'s own library (their code, zzwjames/FailureLLMUnlearning `utils.py`, loads the
  model with transformers' `BitsAndBytesConfig(load_in_4bit=True)` or `load_in_8bit=True`). int8 is LLM.int8's
  weight grid (`Int8Params`: the weight in float16, one absmax scale per output row, 127 levels a side); int4 is
  `Linear4bit`'s (`quant_type` fp4, transformers' default and so theirs, or nf4; bitsandbytes' block size, 64).
  bitsandbytes 0.50 computes both grids on the CPU as well.

What is evaluated: a *dequantized* checkpoint. Each quantized weight is rounded to its int8/int4 grid by the
library and written back in the model's dtype, so the runner's lm-eval `cru` model loads an ordinary checkpoint. The
attack therefore measures exactly the weight rounding (what Zhang et al. attribute the recovery to); it does not
run quantized kernels, whose activations in higher precision would differ from these only by floating-point
rounding (LLM.int8 also quantizes the activations outside its outlier columns; that part is not measured).
Biases, norms and embeddings stay as they are.

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
LIBRARIES = ("optimum-quanto", "bitsandbytes")
QUANT_TYPES = ("fp4", "nf4")   # bitsandbytes' 4-bit grids
EXTRA = "attacks"


class MissingDependencyError(UserError, ImportError):
    """An optional library an attack needs is not installed."""


@dataclass
class QuantizeConfig:
    """`weights`: int8 or int4 (Zhang et al.'s two settings; 4 bits is where they find the recovery).
    `exclude`: module-name patterns (fnmatch) left in full precision; `lm_head` as in GPTQ/AWQ and Zhang et al.
    `library`: whose grid (see the module docstring); `quant_type`: bitsandbytes' 4-bit grid."""
    weights: str = "int4"
    exclude: tuple[str, ...] = field(default=("lm_head",))
    library: str = "optimum-quanto"
    quant_type: str = "fp4"

    def __post_init__(self):
        if self.weights not in WEIGHT_TYPES:
            raise InputError(f"weights {self.weights!r}: choose one of {', '.join(WEIGHT_TYPES)}")
        if self.library not in LIBRARIES:
            raise InputError(f"library {self.library!r}: choose one of {', '.join(LIBRARIES)}")
        if self.quant_type not in QUANT_TYPES:
            raise InputError(f"quant_type {self.quant_type!r}: choose one of {', '.join(QUANT_TYPES)}")
        if self.quant_type != "fp4" and (self.library != "bitsandbytes" or self.weights != "int4"):
            raise InputError("quant_type picks bitsandbytes' 4-bit grid: it needs library: bitsandbytes and "
                             "weights: int4")
        from ..hparams import as_list

        self.exclude = as_list("exclude", self.exclude, "module-name patterns")
        if not all(isinstance(p, str) and p for p in self.exclude):
            raise InputError(f"exclude must be a list of module-name patterns, got {self.exclude!r}")


def _library(name: str):
    module = {"optimum-quanto": "optimum.quanto", "bitsandbytes": "bitsandbytes.functional"}[name]
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingDependencyError(
            f"the quantize attack needs {name}: pip install 'cru-harness[{EXTRA}]' ({err})") from None


def _rounder(config: QuantizeConfig):
    """fn(linear module) -> (its weight rounded to the library's grid, in its dtype; the group size or None for
    one scale per output row)."""
    import torch

    if config.library == "optimum-quanto":
        quanto = _library("optimum-quanto")
        qtype = {"int8": quanto.qint8, "int4": quanto.qint4}[config.weights]

        def rounded(module):
            # one module at a time (quanto copies it), so the model is never held twice
            quantized = quanto.quantize_module(module, weights=qtype)
            quantized.freeze()
            return quantized.qweight.dequantize().to(module.weight.dtype), quantized.weight_group_size
        return rounded
    bnb = _library("bitsandbytes")

    def rounded(module):
        weight = module.weight.detach()
        if config.weights == "int8":   # Int8Params._quantize: float16, then one absmax per row
            codes, row_absmax, _ = bnb.int8_vectorwise_quant(weight.to(torch.float16).contiguous())
            return bnb.int8_vectorwise_dequant(codes, row_absmax).to(weight.dtype), None
        packed, state = bnb.quantize_4bit(weight.contiguous(), quant_type=config.quant_type)
        return bnb.dequantize_4bit(packed, state).to(weight.dtype), state.blocksize
    return rounded


def reference_weights(path: str | None):
    """fn(module name) -> that linear module's weight in the checkpoint at `path` (read one tensor at a time from
    its safetensors files, so the model is never held twice), or None when `path` is no local safetensors
    checkpoint (the noise floor then has no unlearning change)."""
    from pathlib import Path

    files = sorted(Path(path).glob("*.safetensors")) if path and Path(path).is_dir() else []
    if not files:
        return None
    from safetensors import safe_open

    where = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            where.update({key: file for key in handle.keys()})

    def weight(name: str):
        file = where.get(f"{name}.weight")
        if file is None:
            return None
        with safe_open(str(file), framework="pt") as handle:
            return handle.get_tensor(f"{name}.weight")
    return weight


def round_weights(model, config: QuantizeConfig, reference=None) -> dict:
    """Round every linear weight of `model` (but `config.exclude`) through the library's int8/int4 grid and back,
    in place. Returns what was done: the modules, their group sizes and the weights' relative change (relative L2
    and mean absolute change). `reference` (`reference_weights`: the model before unlearning) adds the noise floor:
    the same two numbers for the unlearning's change from it, over the same modules, so the rounding's size can be
    read beside what unlearning moved (Zhang et al.: recovery where unlearning moved weights by less than a step)."""
    import torch

    rounder = _rounder(config)
    names, group_sizes, change, norm, tied = [], set(), 0.0, 0.0, []
    abs_change, count = 0.0, 0
    unlearned = {"l2": 0.0, "abs": 0.0, "norm": 0.0, "missing": []} if reference is not None else None
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
            if unlearned is not None:
                before = reference(name)
                if before is None or before.shape != module.weight.shape:
                    unlearned["missing"].append(name)
                else:
                    moved = module.weight.detach().float().cpu() - before.float()
                    unlearned["l2"] += float(moved.pow(2).sum())
                    unlearned["abs"] += float(moved.abs().sum())
                    unlearned["norm"] += float(before.float().pow(2).sum())
            rounded, group_size = rounder(module)
            group_sizes.add(group_size)
            delta = (rounded.float() - module.weight.float())
            change += float(delta.pow(2).sum())
            abs_change += float(delta.abs().sum())
            count += delta.numel()
            norm += float(module.weight.float().pow(2).sum())
            module.weight.copy_(rounded)
            names.append(name)
            del rounded
    if not names:
        raise InputError(f"quantize: no linear layer left to quantize (exclude={list(config.exclude)})")
    grid = config.weights + (f" {config.quant_type}" if config.library == "bitsandbytes" and
                             config.weights == "int4" else "")
    return {"library": f"{config.library} {_version(config.library)}", "weights": grid,
            "exclude": list(config.exclude),
            "n_modules": len(names), "tied_to_embedding_left": tied,
            "group_sizes": sorted(str(g) if g else "per output channel" for g in group_sizes),
            "relative_weight_change": (change / norm) ** 0.5 if norm else 0.0,
            "mean_abs_weight_change": abs_change / count if count else 0.0,
            **_noise_floor(unlearned, count),
            "checkpoint": "dequantized (weights rounded to the grid and stored in the model's dtype)"}


def _noise_floor(unlearned: dict | None, count: int) -> dict:
    """The unlearning's change from the reference over the rounded modules (absent without a reference)."""
    if unlearned is None:
        return {}
    if unlearned["missing"]:   # another architecture or a renamed module: no comparable number
        return {"unlearning_weight_change": None, "unlearning_mean_abs_weight_change": None,
                "unlearning_change_note": f"{len(unlearned['missing'])} module(s) not in the reference checkpoint "
                                          f"(first: {unlearned['missing'][0]})"}
    return {"unlearning_weight_change": (unlearned["l2"] / unlearned["norm"]) ** 0.5 if unlearned["norm"] else 0.0,
            "unlearning_mean_abs_weight_change": unlearned["abs"] / count if count else 0.0}


def _version(library: str) -> str:
    from importlib.metadata import version

    return version(library)


class QuantizeAttack(Attack):
    name = "quantize"
    summary = ("weight-only int8/int4 round-to-nearest (optimum-quanto, or bitsandbytes as Zhang et al.), evaluated "
               "as a dequantized checkpoint")
    config = QuantizeConfig
    order = 120
    needs_one_checkpoint = True   # no cell for a WHP model (two checkpoints)

    def run(self, ctx: CellContext) -> Trained:
        config = QuantizeConfig(**ctx.cell.extra["attack"]["settings"])
        _library(config.library)    # a missing library is reported before the model is loaded
        model, tokenizer = ctx.load_model(ctx.model_path)
        # the noise floor: the unlearning's weight change from the model it started from, beside the rounding's
        reference = reference_weights(ctx.base_path) if ctx.base_path and ctx.base_path != ctx.model_path else None
        details = round_weights(model, config, reference=reference)
        if reference is None:
            details["unlearning_change_note"] = (
                "the attacked model is the one it started from (the Original, or an adapter's untouched base): "
                "no unlearning change" if ctx.base_path and ctx.base_path == ctx.model_path else
                "no local safetensors checkpoint of the model it started from: no unlearning change")
            if ctx.base_path and ctx.base_path == ctx.model_path:
                details["unlearning_weight_change"] = details["unlearning_mean_abs_weight_change"] = 0.0
        details["reference_checkpoint"] = ctx.base_path
        details["routers_kept"] = ctx.routers
        out = ctx.workdir / "quantized"
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        ctx.outcome["details"]["quantize"] = details
        return Trained(str(out), routers=ctx.routers)


ATTACK = QuantizeAttack()
