"""One place for devices and dtypes: parse what a user typed, check it can run here, load models onto it.

Every command (`unlearn`, `finetune`, `score --original-model`) and the runner go through this module, so a
device string means the same everywhere and a bad one fails the same way: a `DeviceError` (a `UserError` and
a `ValueError`, so the command lines print it as one line) that names the problem.

- device: `auto` (CUDA when present, else CPU), `cpu`, `cuda`, `cuda:N`.
- device_map: `None` (the whole model on `device`) or `auto` (accelerate shards it over the visible GPUs, then
  CPU), or a dict as transformers takes it (Python API only).
- dtype: `auto` (the checkpoint's own), `float32`, `bfloat16`, `float16`; bf16 on a GPU without bf16 is an
  error, not a silent fp32 run.
- `training_precision` / `saved_dtype`: how a full-parameter trainer (baselines, fine-tuning) runs a dtype:
  fp32 master weights under bf16 / fp16 autocast (AdamW on bf16 or fp16 weights loses most updates), saved
  in the dtype asked for; a config's `precision: bf16` steps bf16 weights instead (`training.engine`).
- `launched_processes`: how many processes `accelerate launch` / torchrun started (only the trainers of
  `finetune` and the baselines run data parallel).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
from typing import TYPE_CHECKING, Any

from .errors import UserError

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions: the CLI builds its parsers (add_device_arguments) without it.
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N"  # (and mps, Apple GPUs, unadvertised)
HALF_DTYPES = ("bfloat16", "float16")   # 16-bit floats: lm-eval's log-softmax needs softmax_dtype=float32 there
DTYPE_NAMES = ("auto", "float32", *HALF_DTYPES)
DEVICE_MAP_CHOICES = ("auto",)
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|mps)(?::(\d+))?$")


class DeviceError(UserError, ValueError):
    """A device, device map or dtype that is malformed or cannot run on this machine (one line, no traceback)."""


class GPUMemoryError(DeviceError):
    """A training step that did not fit in the GPU's memory: one line with the sizes torch reported and the
    settings that make the step smaller (a UserError: the CLI prints it, the runner records it as the reason)."""


_OOM_SIZES = re.compile(r"Tried to allocate (?P<asked>[\d.]+ \w+)\. GPU (?P<gpu>\d+) has a total capacity of "
                        r"(?P<total>[\d.]+ \w+) of which (?P<free>[\d.]+ \w+) is free")


@contextlib.contextmanager
def explain_out_of_memory(what: str, smaller: str):
    """Turn CUDA's out-of-memory error inside the block (or the decorated function) into a `GPUMemoryError`:
    "`what`: CUDA out of memory (GPU 0: 2.00 GiB asked, 1.06 GiB of 79.19 GiB free); `smaller`". torch's own
    error stays chained (`__cause__`) for a Python caller."""
    import torch

    try:
        yield
    except torch.cuda.OutOfMemoryError as err:
        found = _OOM_SIZES.search(str(err))
        sizes = (f" (GPU {found['gpu']}: {found['asked']} asked, {found['free']} of {found['total']} free)"
                 if found else "")
        raise GPUMemoryError(f"{what}: CUDA out of memory{sizes}; {smaller}") from err


def launched_processes() -> int:
    """The process count `accelerate launch` / torchrun started this command with (their WORLD_SIZE; 1 alone)."""
    return int(os.environ.get("WORLD_SIZE") or 1)


def check_device_spec(spec: str) -> str:
    """Validate the syntax of a device string without touching the hardware; returns it normalised."""
    text = str(spec).strip().lower()
    match = _DEVICE_RE.match(text)
    if not match or (match.group(2) is not None and match.group(1) != "cuda"):
        raise DeviceError(f"device {spec!r} is not one of {DEVICE_CHOICES}")
    return text


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """The torch device for `spec`; `auto` = cuda when available, else cpu. A CUDA device that is not there
    (no CUDA build, no GPU visible, index out of range) is a `DeviceError` naming what is missing."""
    import torch

    if isinstance(spec, torch.device):
        # accelerate names the CPU of a multi-process CPU run "cpu:0"; there is one CPU
        spec = "cpu" if spec.type == "cpu" else str(spec)
    text = check_device_spec("auto" if spec is None else spec)
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(text)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise DeviceError(f"device {text!r}: {why} (torch {torch.__version__}); use --device cpu or auto")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise DeviceError(f"device {text!r}: only {count} CUDA device(s) visible (cuda:0..cuda:{count - 1})")
    return device


def check_device_map(device_map: Any) -> Any:
    """`None`, `"auto"` or a dict (module name -> device). Anything else is a `DeviceError`."""
    if device_map is None or isinstance(device_map, dict):
        return device_map
    text = str(device_map).strip().lower()
    if text in ("", "none"):
        return None
    if text not in DEVICE_MAP_CHOICES:
        raise DeviceError(f"device_map {device_map!r}: only 'auto' (shard over the visible GPUs) is supported")
    return text


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | str:
    """A dtype name -> torch dtype; `auto`/None stays "auto" (the checkpoint's own dtype)."""
    import torch

    _DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if isinstance(name, torch.dtype):
        if name not in _DTYPES.values():
            raise DeviceError(f"dtype {name} is not one of {', '.join(DTYPE_NAMES)}")
        return name
    text = "auto" if name is None else str(name).strip().lower().removeprefix("torch.")
    text = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
            "float": "float32"}.get(text, text)
    if text == "auto":
        return "auto"
    if text not in _DTYPES:
        raise DeviceError(f"dtype {name!r} is not one of {', '.join(DTYPE_NAMES)}")
    return _DTYPES[text]


def dtype_name(dtype: torch.dtype | str) -> str:
    """`torch.bfloat16` -> "bfloat16" ("auto" stays "auto")."""
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


def checkpoint_dtype(path: str, *, trust_remote_code: bool = False) -> str:
    """The dtype name a checkpoint declares in its config, as transformers' `dtype="auto"` would load it
    (float32 when it declares none). A declared dtype outside DTYPE_NAMES is a `DeviceError`."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if declared is None:
        return "float32"
    try:
        name = dtype_name(parse_dtype(declared))
    except DeviceError:
        raise DeviceError(f"checkpoint {path}: its config declares dtype {declared}, not one of "
                          f"{', '.join(DTYPE_NAMES[1:])}; set dtype explicitly") from None
    return "float32" if name == "auto" else name


def check_dtype_on_device(dtype: torch.dtype | str, device: torch.device) -> None:
    """A dtype the device cannot compute in is a `DeviceError` (bf16 on a GPU older than Ampere)."""
    import torch

    if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(device)
        raise DeviceError(f"dtype bfloat16: {name} has no bf16 support; use --dtype float16 or float32")


def training_precision(dtype: str | torch.dtype | None) -> tuple[torch.dtype, str]:
    """(dtype the weights train in, accelerate mixed_precision) for a full-parameter trainer.

    fp32 master weights: float32 / auto -> no autocast; bfloat16 -> bf16 autocast; float16 -> fp16 autocast with
    loss scaling. TOFU's and RWKU's runs train bf16 this way (DeepSpeed ZeRO keeps fp32 master weights and Adam
    moments; RWKU's LLaMA-Factory casts full fine-tuning to fp32): AdamW stepping bf16 weights loses every update
    smaller than half a bf16 step of the weight, i.e. most updates at lr 1e-5. Others step bf16 weights directly
    (WMDP's RMU: rmu/utils.py loads the checkpoint's bf16, rmu/unlearn.py steps it; open-unlearning's community
    scripts, HF Trainer on its bf16 model configs without DeepSpeed; MUSE's fine-tunes): a config's
    `precision: bf16` trains so (`training.engine`).
    The trained weights are saved in `saved_dtype(dtype)`.
    """
    import torch

    parsed = parse_dtype(dtype)
    if parsed == torch.bfloat16:
        return torch.float32, "bf16"
    if parsed == torch.float16:
        return torch.float32, "fp16"
    return torch.float32, "no"


def saved_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """The dtype a trainer saves its weights in: the one asked for (float32 for `auto`), as DeepSpeed saves a
    bf16 run's weights in bf16; a checkpoint half the size of its fp32 master weights."""
    import torch

    parsed = parse_dtype(dtype)
    return torch.float32 if parsed == "auto" else parsed


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether a `device_map` split the model over several devices (accelerate's hooks then move activations
    between them, so the model is not moved whole). A one-device map is not a split: transformers 4 records it in
    `hf_device_map`, transformers 5 does not."""
    return len(set((getattr(model, "hf_device_map", None) or {}).values())) > 1


def input_device(model: torch.nn.Module) -> torch.device:
    """Where a model's input ids go: the device of its input embeddings (the first device of a split model;
    parameters still on `meta` under accelerate's offloading are skipped)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None:
        for param in embeddings.parameters():
            if param.device.type != "meta":
                return param.device
    return next(model.parameters()).device


def load_causal_lm(path: str, *, device: str | torch.device | None = "auto", device_map: Any = None,
                   dtype: str | torch.dtype | None = "auto", trust_remote_code: bool = False,
                   load_tokenizer: bool = True):
    """(model, tokenizer) from a HF id or directory, in `dtype`, on `device` or sharded by `device_map`.

    With a device_map the model is placed by accelerate (`device` is then only checked); without one it is
    loaded whole onto `device` (a GPU's tensors straight there, never all on the CPU first). The model is returned
    in eval mode. Errors loading the checkpoint are left to transformers (their messages name the path).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .locations import check_remote_code, check_single_checkpoint

    check_single_checkpoint(path)
    check_remote_code(path, trust_remote_code)
    target = resolve_device(device)
    device_map = check_device_map(device_map)
    torch_dtype = parse_dtype(dtype)
    check_dtype_on_device(torch_dtype, target)
    if device_map is not None and target.type == "cpu" and device_map == "auto" and torch.cuda.is_available():
        raise DeviceError("device_map 'auto' shards over GPUs; with --device cpu leave --device-map unset")
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}
    if device_map is not None:
        kwargs["device_map"] = device_map
    elif target.type == "cuda":
        # Each tensor goes straight to the GPU (as lm-eval's HFLM loads): loading on the CPU first holds the whole
        # model in host memory, in fp32 for a trainer (a 7B model: 28 GB, per process under accelerate launch).
        index = torch.cuda.current_device() if target.index is None else target.index
        kwargs["device_map"] = {"": f"cuda:{index}"}
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if device_map is None:
        model = model.to(target)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code) if load_tokenizer else None
    return model, tokenizer


def add_device_arguments(parser: argparse.ArgumentParser, *, dtype_default: str = "float32",
                         dtype_help: str | None = None, device_map: bool = True) -> None:
    """`--device`, `--device-map` and `--dtype`, the same on every command."""
    parser.add_argument("--device", default="auto", metavar="DEVICE",
                        help=f"{DEVICE_CHOICES} (default auto: CUDA when present, else CPU)")
    if device_map:
        parser.add_argument("--device-map", default=None, choices=DEVICE_MAP_CHOICES,
                            help="'auto': shard the model over the visible GPUs (models larger than one GPU)")
    parser.add_argument("--dtype", default=dtype_default, choices=DTYPE_NAMES[1:] if dtype_default != "auto"
                        else DTYPE_NAMES, help=dtype_help or f"dtype of the model weights (default {dtype_default})")
