"""Sums whose float rounding does not depend on the number of CPU threads.

PyTorch's CPU kernels reduce a tensor to a single element of >= 32768 values in one partial sum per thread
(ATen's two-pass reduction), so the rounding of `x.sum()` changes with `torch.get_num_threads()`. A reduction with
several outputs gives each output to one thread, which sums it in a fixed order. Summing fixed-size chunks first
and then the chunk totals therefore gives the same bits at any thread count; it is what keeps CRU's router
training reproducible on another machine of the same kind with a different thread setting.
"""
from __future__ import annotations

import torch

CHUNK = 4096  # below ATen's grain size (32768), so each chunk and the chunk totals are summed by one thread


def thread_invariant_sum(values: torch.Tensor) -> torch.Tensor:
    """`values.sum()` (differentiable), with the same rounding at any CPU thread count."""
    flat = values.reshape(-1)
    pad = (-flat.numel()) % CHUNK
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    totals = flat.view(-1, CHUNK).sum(dim=1)
    while totals.numel() >= CHUNK * 8:  # > 134M values: chunk the totals too, for the same reason
        pad = (-totals.numel()) % CHUNK
        totals = torch.cat([totals, totals.new_zeros(pad)]).view(-1, CHUNK).sum(dim=1)
    return totals.sum()


def thread_invariant_outer_sum(grad: torch.Tensor, inputs: torch.Tensor, *, max_elements: int = 1 << 22
                               ) -> torch.Tensor:
    """`grad.T @ inputs` for (N, m) and (N, n) tensors: the weight gradient of a linear layer, summed over N.

    A BLAS GEMM with a small m x n output and a long N splits N across threads, so its rounding changes with the
    thread count. Here each chunk of rows is an elementwise product reduced over its rows (one thread per output
    element), and the chunk results are reduced the same way: the same bits at any thread count, at the cost of
    materialising up to `max_elements` floats per chunk.
    """
    rows = max(1, max_elements // max(1, grad.shape[1] * inputs.shape[1]))
    partials = [(grad[s:s + rows, :, None] * inputs[s:s + rows, None, :]).sum(dim=0)
                for s in range(0, grad.shape[0], rows)]
    return partials[0] if len(partials) == 1 else torch.stack(partials).sum(dim=0)
