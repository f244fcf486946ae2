"""Attach router bundles to a base model with forward hooks, and take them off again.

The base is never copied or modified: gating happens in a forward hook on each gated block, which replaces the
block's output by `h'` (selected coordinates multiplied by their gates). One hook per block serves every
attached bundle, so each router reads the *ungated* `h_l` of its block and the gates of several bundles on the
same coordinate multiply. A bundle with `gate_site="mlp"` gates the input of the block's MLP down projection
instead (a pre-hook there), its routers reading the block's input (`sites.py`). Removing the last bundle removes
the hooks, so the model is exactly the base again.
"""
from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ..training.blocks import block_device, block_output_tensor, find_decoder_blocks, replace_block_output
from .bundle import BaseWeightsWarning, IncompatibleBaseError, RouterBundle, base_weights_problem
from .readings import scope_mask, site_module
from .router import Router
from ..training.sites import mlp_down_projection, mlp_width

# A callback (block index, bundle, gates (B, T, |C|) float32 with grad) -> None, used by router training.
GateObserver = Callable[[int, RouterBundle, torch.Tensor], None]


class _ScopeTracker:
    """For bundles of `token_scope="answer"` (`readings.py`): a pre-hook on the model's own forward keeps the
    token ids of each call, from which every gating hook finds its bundle's answer scope. A call that continues a
    cache (a generation step) holds positions after the prompt only: all in scope."""

    def __init__(self, model: nn.Module):
        self.users = 0
        self.ids: torch.Tensor | None = None
        self.continuing = False
        self._masks: dict[tuple, torch.Tensor] = {}
        self.handle = model.register_forward_pre_hook(self._see, with_kwargs=True)

    def _see(self, _module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        past = kwargs.get("past_key_values", kwargs.get("cache"))   # "cache": transformers 5's name
        seen = past.get_seq_length() if hasattr(past, "get_seq_length") else 0
        self.ids = ids if isinstance(ids, torch.Tensor) else None
        self.continuing, self._masks = bool(seen), {}
        return None

    def mask(self, marker: tuple, shape: torch.Size) -> torch.Tensor:
        """(B, T) bool: the positions of the current call in `marker`'s answer scope."""
        if self.continuing:
            return torch.ones(tuple(shape[:2]), dtype=torch.bool)
        if self.ids is None:
            raise RuntimeError("a token_scope=answer bundle needs the model called with input_ids (it finds the "
                               "answer by the prompt's end marker); got inputs_embeds or nothing")
        if tuple(self.ids.shape) != tuple(shape[:2]):
            raise RuntimeError(f"token_scope=answer: the gated block saw {tuple(shape[:2])} positions, the model's "
                               f"input_ids are {tuple(self.ids.shape)}")
        if marker not in self._masks:
            self._masks[marker] = scope_mask(self.ids.cpu(), None, marker).bool()
        return self._masks[marker]


# model -> its scope tracker (while a token_scope="answer" bundle is attached)
_SCOPES: "weakref.WeakKeyDictionary[nn.Module, _ScopeTracker]" = weakref.WeakKeyDictionary()


@dataclass(eq=False)
class _Entry:
    bundle: RouterBundle
    router: Router
    neurons: torch.Tensor
    observer: GateObserver | None
    scope: _ScopeTracker | None = None   # token_scope="answer": gates act in the answer scope only


def _gates(index: int, entry: _Entry, router_input: torch.Tensor) -> torch.Tensor:
    router = entry.router
    if router.w1.weight.device != router_input.device:  # e.g. device_map offloading moved the block after attach
        router.to(router_input.device)
    gates = router(router_input)
    if entry.observer is not None:
        entry.observer(index, entry.bundle, gates)
    if entry.scope is not None:   # outside the answer scope the gate is 1: the position passes unchanged
        inside = entry.scope.mask(tuple(entry.bundle.config.answer_marker), gates.shape).to(gates.device)
        gates = torch.where(inside.unsqueeze(-1), gates, torch.ones_like(gates))
    return gates


def _gated(index: int, entries: list[_Entry], router_input: torch.Tensor, site: torch.Tensor) -> torch.Tensor:
    """`site` with its selected coordinates multiplied by the gates every entry's router computes from
    `router_input` (detached: routers read an ungated input; no gradient into the base through them)."""
    if len(entries) == 1:
        entry = entries[0]
        gate_product, neurons = _gates(index, entry, router_input), entry.neurons.to(site.device)
    else:
        # Several bundles: combine gates per coordinate (float32 product) over the union of coordinates.
        full = torch.ones(*site.shape[:-1], site.shape[-1], dtype=torch.float32, device=site.device)
        for entry in entries:
            neurons_e = entry.neurons.to(site.device)
            full[..., neurons_e] = full[..., neurons_e] * _gates(index, entry, router_input).to(site.device)
        neurons = torch.unique(torch.cat([e.neurons.to(site.device) for e in entries]))
        gate_product = full[..., neurons]
    # The gate applied to the flowing stream is detached: routers learn only from the gate-value loss, and
    # a graph through the later (frozen) blocks would cost memory for nothing.
    gated = site.clone()
    gated[..., neurons] = site[..., neurons] * gate_product.detach().to(site.device, site.dtype)  # model dtype
    return gated


class _BlockGating:
    """Gate site "residual" (the paper): the single forward hook of one block, applying every attached router
    of that block to the block's output; routers read that output ungated."""

    def __init__(self, block: nn.Module, index: int):
        self.index = index
        self.entries: list[_Entry] = []
        self.handles = [block.register_forward_hook(self)]

    def __call__(self, _module, _args, output):
        if not self.entries:
            return output
        hidden = block_output_tensor(output)
        return replace_block_output(output, _gated(self.index, self.entries, hidden.detach(), hidden))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class _MLPGating:
    """Gate site "mlp": a pre-hook on the block keeps its input (the residual stream entering it, which the
    routers read), and a pre-hook on the MLP's down projection gates the selected neurons of its input."""

    def __init__(self, block: nn.Module, down_proj: nn.Module, index: int):
        self.index = index
        self.entries: list[_Entry] = []
        self._router_input: torch.Tensor | None = None
        self.handles = [block.register_forward_pre_hook(self._keep_input, with_kwargs=True),
                        down_proj.register_forward_pre_hook(self._gate)]

    def _keep_input(self, _module, args, kwargs):
        hidden = args[0] if args else kwargs.get("hidden_states")
        self._router_input = hidden.detach() if isinstance(hidden, torch.Tensor) else None
        return None

    def _gate(self, _module, args):
        router_input, self._router_input = self._router_input, None  # used once, not kept alive
        if not self.entries or not args:
            return None
        if router_input is None:
            raise RuntimeError(f"block {self.index}: the MLP ran without the block's input being seen; "
                               "gate_site=mlp needs the down projection to run inside its decoder block")
        site = args[0]
        return (_gated(self.index, self.entries, router_input.to(site.device), site), *args[1:])

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self._router_input = None


# hooked module (the block for "residual", its MLP down projection for "mlp") -> its gating; weak so a deleted
# model does not stay alive through this table.
_GATINGS: "weakref.WeakKeyDictionary[nn.Module, _BlockGating | _MLPGating]" = weakref.WeakKeyDictionary()


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
            if entry.scope is not None:
                entry.scope.users -= 1
                if entry.scope.users == 0:
                    entry.scope.handle.remove()
                    if _SCOPES.get(self.model) is entry.scope:
                        del _SCOPES[self.model]
            gating = _GATINGS.get(block)
            if gating is None:
                continue
            gating.entries = [e for e in gating.entries if e is not entry]
            if not gating.entries:  # no router left: drop the hooks so the block is exactly the base again
                gating.remove()
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
            problem = base_weights_problem(bundle.config.base_weights, model)
            if problem:   # a warning, not a refusal: gating another base can be the experiment
                warnings.warn(f"{problem} ({bundle.config.base_model}): the routers gate another model than the one "
                              "they were trained on (e.g. the released model instead of its fine-tune), so the "
                              "numbers are not the bundle's", BaseWeightsWarning, stacklevel=2)
    _, blocks = find_decoder_blocks(model)
    attached: list[tuple[nn.Module, _Entry]] = []
    for bundle in bundles:
        site = bundle.config.gate_site
        for index in bundle.block_indices:
            block = blocks[index]
            key = (site_module(model, index, bundle.config.block_output) if site == "residual"
                   else mlp_down_projection(block, index))
            if site == "mlp":
                width = mlp_width(key)
                expected = bundle.config.site_width
                if expected is not None and width != expected:
                    raise IncompatibleBaseError(
                        f"bundle gates {expected} MLP neurons per block, block {index} of the model has {width} "
                        f"(base of the bundle: {bundle.config.base_model})")
            device = block_device(block)
            router = bundle.router(index)
            if device is not None:
                router.to(device=device, dtype=torch.float32)
            gating = _GATINGS.get(key)
            if gating is None:
                gating = _GATINGS[key] = (_BlockGating(key, index) if site == "residual"
                                          else _MLPGating(block, key, index))
            scope = None
            if bundle.config.token_scope == "answer":
                scope = _SCOPES.get(model)
                if scope is None:
                    scope = _SCOPES[model] = _ScopeTracker(model)
                scope.users += 1
            entry = _Entry(bundle, router, bundle.neuron_indices(index).to(device or "cpu"), observer, scope)
            gating.entries.append(entry)
            attached.append((key, entry))
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
