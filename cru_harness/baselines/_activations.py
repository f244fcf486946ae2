"""Reading a decoder block's output (the residual stream after block l) during a forward pass, and the masked
activation distances the representation methods (RMU) train on."""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..training.blocks import find_decoder_blocks


def unwrapped(model: nn.Module) -> nn.Module:
    """The model inside a DDP / accelerate wrapper (hooks go on its modules; the forward goes through the wrapper,
    which synchronises the gradients)."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model


def decoder_block(model: nn.Module, layer: int) -> nn.Module:
    _, blocks = find_decoder_blocks(unwrapped(model))
    if not 0 <= layer < len(blocks):
        from ..errors import InputError

        raise InputError(f"layer {layer}: the model has decoder blocks 0..{len(blocks) - 1}")
    return blocks[layer]


@contextlib.contextmanager
def capture_output(module: nn.Module):
    """Collect `module`'s output (its first element when a tuple) on each forward pass inside the block."""
    seen: list[torch.Tensor] = []

    def hook(_module, _inputs, output):
        seen.append(output[0] if isinstance(output, tuple) else output)

    handle = module.register_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def block_output(model: nn.Module, inputs: dict, layer: int, grad: bool = True) -> torch.Tensor:
    """[B, T, d] output of decoder block `layer` on `inputs` (the whole model runs, as the references run it)."""
    with capture_output(decoder_block(model, layer)) as seen, torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    return seen[0]


def masked_mse_per_sequence(activations: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per row: mean over the masked positions of the mean over the d coordinates of the squared difference, in
    float32 (open-unlearning rmu.py `compute_activation_loss` before its batch mean)."""
    mask = mask.to(activations.device)
    squared = (activations.float() - target.float()).pow(2).mean(-1)
    return (squared * mask).sum(-1) / mask.sum(-1)
