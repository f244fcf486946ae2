"""The frozen prefix of router training: the input of the first gated block does not depend on the routers, so
it is computed once per example and reused; each training step then runs only the gated blocks.

Exactness. Each example's prefix is computed *alone* (batch of one, no padding), so it is a function of the
example only: CPU attention kernels give values that depend on the padded length of the batch (PyTorch's SDPA
changes its blocking at 32 positions), so a prefix computed inside one batch would not be bit-identical when
reused inside another. With the cache off (`RouterTrainingConfig.prefix_cache=False`), the same per-example
prefix is recomputed at every step: both modes give identical routers for a seed.

Everything the gated blocks need besides their input (attention mask, position ids, rotary embeddings,
cache_position, per-layer masks of sliding-window families, ...) is built by the model's own forward: a gated
step runs `model(input_ids, attention_mask)` with the blocks below the first gated one replaced by a
pass-through and the first gated block's input replaced by the stacked prefixes, and stops after the last gated
block (the final norm and the LM head never run).
"""
from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator, Mapping, Sequence

import torch
from torch import nn

from ..errors import InputError, UserError
from ..training.blocks import StopForward, block_device, find_decoder_blocks, hidden_size, run_until
from .localize import Batch, input_device
from .readings import run_until_module

CACHE_PLACEMENTS = ("auto", "cpu", "device")
# "auto" keeps the cache on an accelerator only while it is at most this share of the base's weights (or this
# many bytes, for small bases): CRU's point is a peak memory of about the base alone, and a step copies one batch
# of prefixes (a few MiB) from pinned host memory, which costs next to nothing.
AUTO_DEVICE_SHARE = 0.02
AUTO_DEVICE_MIN_BYTES = 256 * 1024 ** 2
GIB = 1024 ** 3


class PrefixCacheError(UserError, ValueError):
    """The prefix cache does not fit where it may be kept."""


def _first_float_dtype(module: nn.Module, default: torch.dtype) -> torch.dtype:
    for param in module.parameters():
        if param.is_floating_point():
            return param.dtype
    return default


class FrozenPrefix:
    """Runs a model in two parts around its gated blocks `first..last`: `example(ids)` gives the input of block
    `first` for one example; `gated_forward(hidden, batch)` runs blocks `first..last` on given inputs."""

    def __init__(self, model: nn.Module, first: int, last: int, stop: nn.Module | None = None):
        _, self.blocks = find_decoder_blocks(model)
        self.stop = stop   # where a gated forward ends when not after block `last` (the final norm: readings.py)
        if not 0 <= first <= last < len(self.blocks):
            raise ValueError(f"gated blocks {first}..{last} are out of range for {len(self.blocks)} blocks")
        self.model, self.first, self.last = model, first, last
        self.hidden_size = hidden_size(model)
        self.device = block_device(self.blocks[first]) or input_device(model)
        embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        self.dtype = _first_float_dtype(embeddings if embeddings is not None else model,
                                        _first_float_dtype(model, torch.float32))
        self._output_rest: tuple | None = None  # what the block below `first` returns besides its hidden state
        self._output_is_tensor = True

    # -- the prefix of one example ----------------------------------------------------------------------------
    @torch.no_grad()
    def example(self, token_ids: Sequence[int]) -> torch.Tensor:
        """The input of the first gated block for this example alone: `(len, d)` in the model's dtype, on the
        first gated block's device."""
        captured: list[torch.Tensor] = []

        def capture(_module, args, kwargs):
            captured.append(args[0] if args else kwargs["hidden_states"])
            raise StopForward

        def record_container(_module, _args, output):  # what the model expects a block to return
            self._output_is_tensor = isinstance(output, torch.Tensor)
            self._output_rest = () if self._output_is_tensor else tuple(output[1:])

        record = None
        if self.first > 0 and self._output_rest is None:
            record = self.blocks[self.first - 1].register_forward_hook(record_container)
        handle = self.blocks[self.first].register_forward_pre_hook(capture, with_kwargs=True)
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=input_device(self.model))
        try:
            run_until(self.model, self.blocks, self.first, input_ids=ids, attention_mask=torch.ones_like(ids))
        finally:
            handle.remove()
            if record is not None:
                record.remove()
        if not captured:
            raise RuntimeError(f"block {self.first} was never called; cannot read its input")
        return captured[0][0].to(self.device)

    # -- the gated blocks on given inputs ---------------------------------------------------------------------
    def stack(self, prefixes: Sequence[torch.Tensor], length: int) -> torch.Tensor:
        """Right-pad per-example prefixes `(len_i, d)` with zeros to `(B, length, d)` on the first gated block's
        device. Padded positions are masked out of every statistic and of attention to real positions."""
        hidden = torch.zeros(len(prefixes), length, self.hidden_size, dtype=prefixes[0].dtype, device=self.device)
        for row, prefix in enumerate(prefixes):
            hidden[row, :prefix.shape[0]] = prefix.to(self.device, non_blocking=True)
        return hidden

    def gated_forward(self, hidden: torch.Tensor, batch: Batch) -> None:
        """Run blocks `first..last` of the model on `batch` with `hidden` as the first gated block's input.
        Forward hooks on the gated blocks (the routers) fire as in a full forward."""
        batch = batch.to(input_device(self.model))
        with self._skip_prefix(hidden):
            if self.stop is None:
                run_until(self.model, self.blocks, self.last, input_ids=batch.input_ids,
                          attention_mask=batch.attention_mask)
            else:
                run_until_module(self.model, self.stop, input_ids=batch.input_ids,
                                 attention_mask=batch.attention_mask)

    @contextlib.contextmanager
    def _skip_prefix(self, hidden: torch.Tensor) -> Iterator[None]:
        def substitute(_module, args, kwargs):
            if args:
                return (hidden, *args[1:]), kwargs
            if "hidden_states" not in kwargs:
                raise RuntimeError(f"block {self.first} was called without a hidden_states argument")
            return args, {**kwargs, "hidden_states": hidden}

        def passthrough(*args, **kwargs):
            state = args[0] if args else kwargs["hidden_states"]
            return state if self._output_is_tensor else (state, *self._output_rest)

        if self.first > 0 and self._output_rest is None:
            raise RuntimeError("compute one example's prefix (FrozenPrefix.example) before a gated forward")
        saved = []
        for block in self.blocks[:self.first]:
            # An instance attribute shadows the class's forward; accelerate's device_map hooks live there too.
            saved.append((block, block.__dict__.get("forward")))
            block.forward = passthrough
        # prepend: the substitution must precede every other pre-hook of the block -- a gate_site="mlp" router
        # reads the block's input from one.
        handle = self.blocks[self.first].register_forward_pre_hook(substitute, with_kwargs=True, prepend=True)
        try:
            yield
        finally:
            handle.remove()
            for block, original in saved:
                if original is None:
                    del block.forward
                else:
                    block.forward = original


def host_available_bytes() -> int:
    import psutil  # a dependency of accelerate

    return int(psutil.virtual_memory().available)


def plan_placement(nbytes: int, device: torch.device, placement: str, base_bytes: int,
                   max_gib: float | None = None) -> torch.device:
    """Where a prefix cache of `nbytes` is kept: the gated block's `device` or the CPU (see `CACHE_PLACEMENTS`).
    `max_gib` bounds host memory (default: what the OS reports as available, less 1 GiB)."""
    if placement not in CACHE_PLACEMENTS:
        raise InputError(f"prefix_cache_placement must be one of {', '.join(CACHE_PLACEMENTS)}, got {placement!r}")
    cpu = torch.device("cpu")
    host_bound = max_gib * GIB if max_gib is not None else max(host_available_bytes() - GIB, 0)
    if device.type != "cpu" and placement in ("auto", "device"):
        free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0
        fits_device = nbytes <= 0.5 * free
        if placement == "device":
            if not fits_device:
                raise PrefixCacheError(
                    f"the CRU prefix cache needs {nbytes / GIB:.2f} GiB, more than half the free memory of "
                    f"{device} ({free / GIB:.2f} GiB); use prefix_cache_placement='cpu' or 'auto', or "
                    "prefix_cache=False")
            return device
        if fits_device and nbytes <= max(AUTO_DEVICE_SHARE * base_bytes, AUTO_DEVICE_MIN_BYTES):
            return device
    if nbytes > host_bound:
        raise PrefixCacheError(
            f"the CRU prefix cache needs {nbytes / GIB:.2f} GiB, more than the host-memory bound of "
            f"{host_bound / GIB:.2f} GiB ({'prefix_cache_max_gib' if max_gib is not None else 'available RAM'}); "
            "set prefix_cache=False (recomputes the frozen prefix at every step), or lower max_length")
    return cpu


class PrefixCache:
    """Per-example prefixes of keyed token sequences: those named by `keep` are computed once (`build`) into one
    flat buffer; any other key -- or every key, when disabled -- is recomputed on each `batch` call. Both give
    identical values."""

    def __init__(self, prefix: FrozenPrefix, sequences: Mapping[Hashable, Sequence[int]],
                 keep: Sequence[Hashable] | None = None, *, enabled: bool = True, placement: str = "auto",
                 max_gib: float | None = None, base_bytes: int = 0):
        self.prefix, self.sequences, self.enabled = prefix, sequences, enabled
        self.keep = list(dict.fromkeys(sequences if keep is None else keep))
        self.n_tokens = sum(len(sequences[key]) for key in self.keep)
        itemsize = torch.empty((), dtype=prefix.dtype).element_size()
        self.nbytes = self.n_tokens * prefix.hidden_size * itemsize
        self.device: torch.device | None = None
        self._offsets: dict[Hashable, tuple[int, int]] = {}
        self._buffer: torch.Tensor | None = None
        if enabled:
            self.device = plan_placement(self.nbytes, prefix.device, placement, base_bytes, max_gib)

    @property
    def built(self) -> bool:
        return self._buffer is not None

    def build(self, progress=None) -> None:
        """Compute the prefix of every kept sequence once (a no-op when disabled or already built)."""
        if not self.enabled or self.built or not self.keep:
            return
        pin = self.device.type == "cpu" and self.prefix.device.type == "cuda"
        buffer = None
        start = 0
        for key in self.keep:
            value = self.prefix.example(self.sequences[key])
            if buffer is None:  # the dtype the blocks really receive
                buffer = torch.empty(self.n_tokens, value.shape[-1], dtype=value.dtype, device=self.device,
                                     pin_memory=pin)
            buffer[start:start + value.shape[0]] = value.to(self.device)
            self._offsets[key] = (start, start + value.shape[0])
            start += value.shape[0]
            if progress is not None:
                progress.update(1)
        self._buffer = buffer

    def cached(self, key: Hashable) -> bool:
        return key in self._offsets

    def get(self, key: Hashable) -> torch.Tensor:
        if key in self._offsets:
            start, end = self._offsets[key]
            return self._buffer[start:end]
        return self.prefix.example(self.sequences[key])

    def batch(self, keys: Sequence[Hashable], length: int) -> torch.Tensor:
        """The stacked, zero-padded prefixes of `keys`: `(len(keys), length, d)` on the first gated block's
        device."""
        return self.prefix.stack([self.get(key) for key in keys], length)
