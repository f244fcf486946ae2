"""Attach router bundles to a base model with forward hooks, and take them off again.

The base is never copied or modified: gating happens in a forward hook on each gated block, which replaces the
block's output by `h'` (selected coordinates multiplied by their gates). One hook per block serves every
attached bundle, so each router reads the *ungated* `h_l` of its block and the gates of several bundles on the
same coordinate multiply. Removing the last bundle removes the hook, so the model is exactly the base again.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .blocks import block_device, block_output_tensor, find_decoder_blocks, replace_block_output
from .bundle import RouterBundle
from .router import Router

# A callback (block index, bundle, gates (B, T, |C|) float32 with grad) -> None, used by router training.
GateObserver = Callable[[int, RouterBundle, torch.Tensor], None]


@dataclass(eq=False)
class _Entry:
    bundle: RouterBundle
    router: Router
    neurons: torch.Tensor
    observer: GateObserver | None


class _BlockGating:
    """The single forward hook of one block, applying every attached router of that block."""

    def __init__(self, block: nn.Module, index: int):
        self.index = index
        self.entries: list[_Entry] = []
        self.handle = block.register_forward_hook(self)

    def __call__(self, _module, _args, output):
        if not self.entries:
            return output
        hidden = block_output_tensor(output)
        ungated = hidden.detach()  # routers read the ungated h_l; no gradient into the base through them
        if len(self.entries) == 1:
            entry = self.entries[0]
            gate_product, neurons = self._gates(entry, ungated), entry.neurons.to(hidden.device)
        else:
            # Several bundles: combine gates per coordinate (float32 product) over the union of coordinates.
            full = torch.ones(*hidden.shape[:-1], hidden.shape[-1], dtype=torch.float32, device=hidden.device)
            for entry in self.entries:
                neurons_e = entry.neurons.to(hidden.device)
                full[..., neurons_e] = full[..., neurons_e] * self._gates(entry, ungated)
            neurons = torch.unique(torch.cat([e.neurons.to(hidden.device) for e in self.entries]))
            gate_product = full[..., neurons]
        # The gate applied to the flowing stream is detached: routers learn only from the gate-value loss, and
        # a graph through the later (frozen) blocks would cost memory for nothing.
        gated = hidden.clone()
        gated[..., neurons] = hidden[..., neurons] * gate_product.detach().to(hidden.dtype)  # model dtype
        return replace_block_output(output, gated)

    def _gates(self, entry: _Entry, ungated: torch.Tensor) -> torch.Tensor:
        router = entry.router
        weight = router.w1.weight
        if weight.device != ungated.device:  # e.g. device_map offloading moved the block after attach
            router.to(ungated.device)
        gates = router(ungated)
        if entry.observer is not None:
            entry.observer(self.index, entry.bundle, gates)
        return gates


# block module -> its gating hook; weak so a deleted model does not stay alive through this table.
_GATINGS: "weakref.WeakKeyDictionary[nn.Module, _BlockGating]" = weakref.WeakKeyDictionary()


class RoutingHandle:
    """Returned by `attach_bundles`; `remove()` detaches exactly the bundles it attached."""

    def __init__(self, model: nn.Module, entries: list[tuple[nn.Module, _Entry]]):
        self.model = model
        self._entries = entries

    @property
    def active(self) -> bool:
        return bool(self._entries)

    def remove(self) -> None:
        for block, entry in self._entries:
            gating = _GATINGS.get(block)
            if gating is None:
                continue
            gating.entries = [e for e in gating.entries if e is not entry]
            if not gating.entries:  # no router left: drop the hook so the block is exactly the base again
                gating.handle.remove()
                del _GATINGS[block]
        self._entries = []

    def __enter__(self) -> "RoutingHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def attach_bundles(model: nn.Module, bundles: RouterBundle | Iterable[RouterBundle], *,
                   observer: GateObserver | None = None, check: bool = True) -> RoutingHandle:
    """Gate `model`'s blocks with `bundles` (checked with `check_compatible` first). Returns a handle whose
    `remove()` detaches them. Each router is moved to its block's device and kept in float32."""
    if isinstance(bundles, RouterBundle):
        bundles = [bundles]
    bundles = list(bundles)
    for bundle in bundles:
        if not isinstance(bundle, RouterBundle):
            raise TypeError(f"expected RouterBundle objects, got {type(bundle).__name__}")
        if check:
            bundle.check_compatible(model)
    _, blocks = find_decoder_blocks(model)
    attached: list[tuple[nn.Module, _Entry]] = []
    for bundle in bundles:
        for index in bundle.block_indices:
            block = blocks[index]
            device = block_device(block)
            router = bundle.router(index)
            if device is not None:
                router.to(device=device, dtype=torch.float32)
            gating = _GATINGS.get(block)
            if gating is None:
                gating = _GATINGS[block] = _BlockGating(block, index)
            entry = _Entry(bundle, router, bundle.neuron_indices(index).to(device or "cpu"), observer)
            gating.entries.append(entry)
            attached.append((block, entry))
    return RoutingHandle(model, attached)


@contextlib.contextmanager
def routed(model: nn.Module, *bundles: RouterBundle) -> Iterator[nn.Module]:
    """`with routed(model, bundle_a, bundle_b): ...` -- the model is gated inside the block only."""
    handle = attach_bundles(model, bundles)
    try:
        yield model
    finally:
        handle.remove()


class RoutedModel(nn.Module):
    """An explicit wrapper: the base model with `bundles` attached. `forward` and `generate` delegate to the
    base; other attributes (config, device, ...) are read from it. `detach()` returns the plain base."""

    def __init__(self, model: nn.Module, bundles: RouterBundle | Iterable[RouterBundle]):
        super().__init__()
        self.model = model
        bundles = [bundles] if isinstance(bundles, RouterBundle) else list(bundles)
        self.bundles = nn.ModuleList(bundles)
        self._handle = attach_bundles(model, bundles)

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def generate(self, *args, **kwargs):
        return self.model.generate(*args, **kwargs)

    def detach(self) -> nn.Module:
        """Remove the routers and return the untouched base model."""
        self._handle.remove()
        return self.model

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("model"), name)
