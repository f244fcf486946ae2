"""The `cru` model's `--model_args` checks: what it takes by name (its own and HFLM's; `from_pretrained`'s pass
through), booleans in exactly lm-eval's spellings, no empty entry, dtype / `max_length` / device values by the
project's rules. Each is a `ModelArgumentError` (or `devices.DeviceError`) naming the argument, before any load."""
from __future__ import annotations

import logging
from pathlib import Path

from lm_eval.models.huggingface import HFLM

from cru_harness.errors import UserError

eval_logger = logging.getLogger(__name__)

class ModelArgumentError(UserError, ValueError):
    """A `--model_args` entry the `cru` model does not take."""


def _named_parameters(function) -> frozenset[str]:
    import inspect

    return frozenset(name for name, p in inspect.signature(function).parameters.items()
                     if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self")


_HFLM_ARGUMENTS = _named_parameters(HFLM.__init__)


def known_arguments() -> set[str]:
    """What `cru` takes by name: its own (`base`, `routers`) and HFLM's. Other names go on to
    `from_pretrained` (HFLM forwards them), so only a near miss of a known name is refused."""
    return set(_HFLM_ARGUMENTS) | {"base", "routers", "reference"}


# Arguments transformers' `from_pretrained` takes from **kwargs (so not in its signature); some are near misses
# of HFLM's names (`device_map` ~ `device`, `max_memory` ~ `max_cpu_memory`) and must pass through.
FROM_PRETRAINED_KWARGS = frozenset({
    "adapter_kwargs", "adapter_name", "attn_implementation", "code_revision", "device_map", "device_mesh",
    "distributed_config", "dtype_plan", "experts_implementation", "from_flax", "from_tf", "generation_config",
    "gguf_file", "key_mapping", "load_in_4bit", "load_in_8bit", "low_cpu_mem_usage", "max_memory", "mirror",
    "offload_buffers", "offload_state_dict", "output_loading_info", "proxies", "quantization_config", "subfolder",
    "torch_dtype", "tp_size", "trust_remote_code", "use_cache", "use_flash_attention_2", "use_kernels", "variant",
})


def _similarity(a: str, b: str) -> float:
    import difflib

    # SequenceMatcher is not symmetric: a transposition ("dtpye") scores differently each way round.
    return max(difflib.SequenceMatcher(None, a, b).ratio(), difflib.SequenceMatcher(None, b, a).ratio())


def check_arguments(kwargs: dict) -> None:
    """Refuse `router=`, `bsae=`, ...: a misspelt argument would otherwise reach the model's constructor.
    Names `from_pretrained` takes pass through, as HFLM forwards them."""
    from transformers import PreTrainedModel

    known = known_arguments()
    forwarded = _named_parameters(PreTrainedModel.from_pretrained) | FROM_PRETRAINED_KWARGS
    for name in kwargs:
        if name in known or name in forwarded:
            continue
        score, best = max((_similarity(name, candidate), candidate) for candidate in sorted(known))
        if score >= 0.75:
            raise ModelArgumentError(f"cru model: unknown argument {name!r} in --model_args (did you mean "
                                     f"{best!r}?)")


def _boolean_parameters(function) -> frozenset[str]:
    """Parameters of `function` annotated `bool` or `bool | None` (annotations may be strings: PEP 563)."""
    import inspect
    import typing

    names = set()
    for name, p in inspect.signature(function).parameters.items():
        annotation = p.annotation
        if isinstance(annotation, str):
            kinds = {part.strip() for part in annotation.replace("Optional[", "").rstrip("]").split("|")}
        else:
            kinds = {getattr(a, "__name__", str(a)) for a in (typing.get_args(annotation) or (annotation,))}
        if "bool" in kinds and kinds <= {"bool", "None", "NoneType"}:
            names.add(name)
    return frozenset(names)


def boolean_arguments() -> frozenset[str]:
    """The `--model_args` entries that are booleans: HFLM's and `from_pretrained`'s (by annotation) and the
    booleans `from_pretrained` takes from **kwargs."""
    from transformers import PreTrainedModel

    return (_boolean_parameters(HFLM.__init__) | _boolean_parameters(PreTrainedModel.from_pretrained)
            | FROM_PRETRAINED_BOOLEANS)


# Booleans among FROM_PRETRAINED_KWARGS (not in any signature, so named here).
FROM_PRETRAINED_BOOLEANS = frozenset({
    "from_flax", "from_tf", "load_in_4bit", "load_in_8bit", "low_cpu_mem_usage", "offload_buffers",
    "offload_state_dict", "output_loading_info", "trust_remote_code", "use_cache", "use_flash_attention_2",
    "use_kernels",
})
#: lm-eval 0.4.13's spellings of a boolean (`lm_eval.utils.handle_arg_string`: case-insensitive).
BOOLEAN_SPELLINGS = {"true": True, "false": False}


def check_boolean_arguments(kwargs: dict) -> None:
    """Normalise (in place) every boolean `--model_args` entry to a bool, or refuse it.

    lm-eval turns `true`/`false` (any case) into bools and hands any other value over as it is: `no` stays a
    non-empty string, which the model's code reads as true (`trust_remote_code=no` would run the checkpoint's
    Python). So exactly lm-eval's spellings are taken (as bools, or as those strings from the Python API), and
    anything else (`yes`, `no`, `0`, `1`) is refused, naming the argument. None is "not given"."""
    for name in sorted(boolean_arguments() & kwargs.keys()):
        value = kwargs[name]
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, str) and value.strip().lower() in BOOLEAN_SPELLINGS:
            kwargs[name] = BOOLEAN_SPELLINGS[value.strip().lower()]
            continue
        raise ModelArgumentError(f"cru model: {name}={value!r} in --model_args is not a boolean: write "
                                 f"{name}=true or {name}=false")


def check_empty_arguments(base, routers, kwargs: dict) -> None:
    """An entry given with no value (`routers=`, `base=`, `dtype=`) is a slip, never a choice: `routers=` empty
    would score the base alone as if it were CRU. Refused, naming it. (Leaving `routers` out is the way to get
    the base alone.)"""
    given = {"base": base, "routers": routers, **kwargs}
    for name, value in given.items():
        if isinstance(value, (str, Path)) and not str(value).strip():
            raise ModelArgumentError(f"cru model: {name}= is empty in --model_args: give a value, or leave "
                                     f"{name} out")
    if isinstance(routers, (list, tuple)) and not routers:
        raise ModelArgumentError("cru model: routers=[] names no bundle: give one or more bundle directories, or "
                                 "leave routers out")
    if isinstance(routers, bool):
        raise ModelArgumentError(f"cru model: routers={routers!r} in --model_args is not a bundle directory: give "
                                 "routers=<dir>[+<dir>...], or leave routers out")


# lm-eval takes these as dtype names and looks them up on `torch` only when it loads the model or scores.
DTYPE_ARGUMENTS = ("dtype", "softmax_dtype", "mixed_precision_dtype")
# What lm-eval's command line passes when `--device` is not given; HFLM then falls back to the CPU without CUDA.
LMEVAL_DEFAULT_DEVICE = "cuda:0"


def check_argument_values(kwargs: dict, *, check_device: bool = True) -> None:
    """Validate (and normalise, in place) the `--model_args` values lm-eval would only trip over later.

    - `dtype`, `softmax_dtype`, `mixed_precision_dtype`: the project's dtype rule (`devices.parse_dtype`), passed
      on by canonical name (`bf16` -> `bfloat16`), or any other torch floating dtype lm-eval takes (`float64`);
      `auto` (the checkpoint's own) is a weight dtype only. lm-eval
      would fail on `float17` with an AttributeError, the softmax one only when it scores.
    - `max_length`: a positive integer (lm-eval fails with a TypeError midway through generation).
    - `device`: the project's device rule (`devices.resolve_device`), so a device that is not there is refused
      before loading; `auto`, and no device at all (HFLM's own default would be `cuda`), become the device `auto`
      resolves to. lm-eval's command-line default `LMEVAL_DEFAULT_DEVICE` without CUDA stays HFLM's fallback to
      the CPU: a run without `--device` must work. (The command line passes that same string for an explicit
      `--device cuda:0`, which therefore falls back too; `cuda`, `cuda:1`, ... are refused.)
      A dtype the device cannot compute in (bf16 on a pre-Ampere GPU) is refused too.
    """
    import torch

    from cru_harness.devices import (DTYPE_NAMES, DeviceError, check_dtype_on_device, dtype_name, parse_dtype,
                                     resolve_device)

    for name in DTYPE_ARGUMENTS:
        value = kwargs.get(name)
        if value is None:
            continue
        try:
            canonical = dtype_name(parse_dtype(value))
        except DeviceError:   # beyond the project's names, any torch floating dtype lm-eval takes (float64, ...)
            text = str(value).strip().lower().removeprefix("torch.")
            found = getattr(torch, text, None)
            canonical = text if isinstance(found, torch.dtype) and found.is_floating_point else None
        if canonical is None or (canonical == "auto" and name != "dtype"):
            choices = DTYPE_NAMES if name == "dtype" else DTYPE_NAMES[1:]
            raise DeviceError(f"cru model: {name}={value!r} in --model_args is not a torch floating dtype (e.g. "
                              f"{', '.join(choices)})")
        kwargs[name] = canonical
    length = kwargs.get("max_length")
    if length is not None:
        if isinstance(length, bool) or not (isinstance(length, int) or str(length).strip().isdigit()) \
                or int(length) <= 0:
            raise ModelArgumentError(f"cru model: max_length={length!r} in --model_args is not a positive integer")
        kwargs["max_length"] = int(length)
    if not check_device:
        return
    device = kwargs.get("device")
    if device is None:   # none given (simple_evaluate without device=): a GPU if there is one
        device = "auto"
    if device == LMEVAL_DEFAULT_DEVICE and not torch.cuda.is_available():
        kwargs["device"] = "cpu"
        eval_logger.warning(f"device {device!r} (lm-eval's default) is not available: running on the CPU")
        return
    resolved = resolve_device(device)
    kwargs["device"] = str(resolved)  # HFLM falls back to any device for `auto`, and takes strings only
    if kwargs.get("dtype") in DTYPE_NAMES[1:]:
        check_dtype_on_device(parse_dtype(kwargs["dtype"]), resolved)
