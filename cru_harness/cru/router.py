"""The CRU routing MLP: `R_l(h) = sigmoid(W2 relu(W1 h + b1) + b2)`, one gate per selected coordinate."""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import InputError
from ..reductions import thread_invariant_outer_sum

INPUT_NORMS = ("none", "rms", "rms_learned")


class Router(nn.Module):
    """Maps a hidden state `h` (..., d) to gates in [0, 1] of shape (..., n_selected), per position.

    `input_norm="rms"` feeds the router `h / rms(h)` (parameter-free): the residual stream of real models has
    huge outlier coordinates, and normalising made training insensitive to the learning rate in our
    observations. `"rms_learned"` is the same with a learned per-dimension scale (`norm_scale`, initialised to 1,
    a router parameter: saved in the bundle and counted). `"none"` is the paper's formulation. Math is always
    float32, whatever the model's dtype.
    """

    def __init__(self, hidden_size: int, n_selected: int, d_r: int, *, input_norm: str = "none"):
        super().__init__()
        if hidden_size < 1 or n_selected < 1 or d_r < 1:
            raise InputError(f"Router needs positive sizes, got hidden_size={hidden_size}, "
                             f"n_selected={n_selected}, d_r={d_r}")
        if input_norm not in INPUT_NORMS:
            raise InputError(f"input_norm must be one of {', '.join(INPUT_NORMS)}, got {input_norm!r}")
        self.hidden_size, self.n_selected, self.d_r, self.input_norm = hidden_size, n_selected, d_r, input_norm
        self.w1 = nn.Linear(hidden_size, d_r, dtype=torch.float32)   # W1: d_r x d, b1
        self.w2 = nn.Linear(d_r, n_selected, dtype=torch.float32)    # W2: |C_l| x d_r, b2
        if input_norm == "rms_learned":  # created after W1/W2 and without the RNG: their seeded init is unchanged
            self.norm_scale = nn.Parameter(torch.ones(hidden_size, dtype=torch.float32))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # float32 inside an autocast region too (lm-eval's `mixed_precision_dtype` wraps the model call in one)
        with _no_autocast(hidden.device.type):
            hidden = hidden.float()
            if self.input_norm in ("rms", "rms_learned"):
                hidden = hidden * torch.rsqrt(hidden.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
            if self.input_norm == "rms_learned":
                hidden = hidden * self.norm_scale
            return torch.sigmoid(_linear(torch.relu(_linear(hidden, self.w1)), self.w2))

    def extra_repr(self) -> str:
        return f"d={self.hidden_size}, d_r={self.d_r}, n_selected={self.n_selected}, input_norm={self.input_norm}"


def _no_autocast(device_type: str):
    """A region where autocast is off on `device_type`; nothing where torch has no autocast for it (mps before
    torch 2.5, meta), since no autocast can be on there either."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


class _CPULinear(torch.autograd.Function):
    """`F.linear` whose weight gradient has the same bits at any CPU thread count (see
    `reductions.thread_invariant_outer_sum`): CRU bundles trained on CPU must not depend on the thread setting."""

    @staticmethod
    def forward(ctx, inputs, weight, bias):
        ctx.save_for_backward(inputs, weight)
        return F.linear(inputs, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        inputs, weight = ctx.saved_tensors
        grad_input = grad @ weight if ctx.needs_input_grad[0] else None
        flat_grad = grad.reshape(-1, grad.shape[-1])
        grad_weight = (thread_invariant_outer_sum(flat_grad, inputs.reshape(-1, inputs.shape[-1]))
                       if ctx.needs_input_grad[1] else None)
        grad_bias = flat_grad.sum(dim=0) if ctx.needs_input_grad[2] else None
        return grad_input, grad_weight, grad_bias


def _linear(inputs: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    if inputs.device.type == "cpu" and torch.is_grad_enabled() and layer.weight.requires_grad:
        return _CPULinear.apply(inputs, layer.weight, layer.bias)
    return layer(inputs)
