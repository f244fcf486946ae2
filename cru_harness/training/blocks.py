"""Generic discovery of a decoder's block list, and helpers to read/replace a block's output.

Nothing here depends on one family's module names: the block list is the `nn.ModuleList` whose length equals the
config's layer count (Llama/Qwen2/Mistral/Phi-3 `model.layers`, GPT-2 `transformer.h`, GPT-NeoX
`gpt_neox.layers`, OPT `model.decoder.layers`, ...).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import InputError, UserError

# Config attribute names different families use for the same quantity, most common first.
_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HIDDEN_SIZE_KEYS = ("hidden_size", "n_embd", "d_model", "dim")
# Stacks that are not the language decoder in multi-tower models.
_NON_DECODER_HINTS = ("encoder", "vision", "visual", "audio", "image")


class DecoderBlocksNotFoundError(UserError, ValueError):
    """The model has no `nn.ModuleList` that looks like its stack of decoder blocks."""


def _text_config(model: nn.Module):
    config = getattr(model, "config", None)
    if config is None:
        raise DecoderBlocksNotFoundError(
            f"{type(model).__name__} has no `.config`; CRU needs a Hugging Face style model with a config")
    get_text_config = getattr(config, "get_text_config", None)
    return get_text_config() if callable(get_text_config) else config


def _config_int(config, keys: tuple[str, ...], what: str) -> int:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    raise DecoderBlocksNotFoundError(
        f"cannot read the {what} from {type(config).__name__}: none of {', '.join(keys)} is set")


def num_layers(model: nn.Module) -> int:
    """Number of decoder blocks according to the model's (text) config."""
    return _config_int(_text_config(model), _LAYER_COUNT_KEYS, "number of layers")


def hidden_size(model: nn.Module) -> int:
    """Width d of the residual stream according to the model's (text) config."""
    return _config_int(_text_config(model), _HIDDEN_SIZE_KEYS, "hidden size")


def vocab_size(model: nn.Module) -> int:
    return int(getattr(_text_config(model), "vocab_size", 0) or 0)


def model_type(model: nn.Module) -> str:
    config = _text_config(model)
    return str(getattr(config, "model_type", "") or type(model).__name__)


def find_decoder_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """Return `(dotted_path, blocks)` for the model's decoder block list.

    The list is the `nn.ModuleList` whose length equals the config's layer count. If several qualify (e.g. an
    encoder and a decoder), stacks named like encoders/vision towers are dropped and the one holding the most
    parameters is kept.
    """
    n_layers = num_layers(model)
    candidates = [(name, module) for name, module in model.named_modules()
                  if isinstance(module, nn.ModuleList) and len(module) == n_layers]
    if not candidates:
        lists = [f"{name} (len {len(module)})" for name, module in model.named_modules()
                 if isinstance(module, nn.ModuleList)]
        raise DecoderBlocksNotFoundError(
            f"no nn.ModuleList of length {n_layers} (the config's layer count) in {type(model).__name__}; "
            f"module lists found: {', '.join(lists) or 'none'}")
    decoder_like = [c for c in candidates if not any(h in c[0].lower() for h in _NON_DECODER_HINTS)]
    candidates = decoder_like or candidates

    def n_params(module: nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    # max() keeps the first of equal candidates, i.e. the outermost/earliest in module order.
    name, blocks = max(candidates, key=lambda c: n_params(c[1]))
    return name, blocks


def resolve_block_indices(n_layers: int, blocks: list[int] | None = None, last_k: int | None = 4) -> list[int]:
    """Sorted, de-duplicated block indices: `blocks` if given (negative indices count from the end), else the
    last `last_k` blocks."""
    if blocks is not None:
        blocks = list(blocks)
        if not blocks:
            raise InputError("blocks= is an empty list; name at least one decoder block")
        resolved = []
        for index in blocks:
            if not isinstance(index, int) or isinstance(index, bool):
                raise InputError(f"block index {index!r} is not an integer")
            if not -n_layers <= index < n_layers:
                raise InputError(f"block index {index} is out of range for a model with {n_layers} blocks")
            resolved.append(index % n_layers)
        return sorted(set(resolved))
    if last_k is None or not isinstance(last_k, int) or not 1 <= last_k <= n_layers:
        raise InputError(f"last_k must be an integer in [1, {n_layers}] for a model with {n_layers} blocks, "
                         f"got {last_k!r}")
    return list(range(n_layers - last_k, n_layers))


def block_output_tensor(output: Any) -> torch.Tensor:
    """The hidden state a decoder block returns: the tensor itself or the first element of its tuple."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"unexpected decoder block output of type {type(output).__name__}; "
                    "expected a tensor or a tuple whose first element is the hidden state")


def replace_block_output(output: Any, hidden: torch.Tensor) -> Any:
    """`output` with its hidden state replaced by `hidden`, keeping the container type."""
    if isinstance(output, torch.Tensor):
        return hidden
    if isinstance(output, tuple):
        return (hidden, *output[1:])
    return [hidden, *output[1:]]


def block_device(block: nn.Module) -> torch.device | None:
    """Device of a block's parameters (None when they are offloaded to `meta`)."""
    for param in block.parameters():
        return None if param.device.type == "meta" else param.device
    return None


class StopForward(Exception):
    """Raised from the hook of the last block a computation needs, so the rest of the model (and the LM head)
    never runs. Caught by `run_until`."""


def run_until(model: nn.Module, blocks: nn.ModuleList, last_index: int, **model_inputs) -> None:
    """Run `model(**model_inputs)` only up to (and including) block `last_index`.

    Forward hooks registered beforehand on the earlier blocks still fire; everything after `last_index` --
    later blocks, the final norm and the LM head -- is skipped.
    """
    run_until_module(model, blocks[last_index], **model_inputs)


def run_until_module(model: nn.Module, module: nn.Module, **model_inputs) -> None:
    """`model(**model_inputs)` up to and including `module` (a block, or the final norm); the rest never runs."""
    def stop(_module, _args, _output):
        raise StopForward

    handle = module.register_forward_hook(stop)
    try:
        model(**model_inputs, use_cache=False)
    except StopForward:
        pass
    finally:
        handle.remove()


#: The final norm of the decoder families the harness knows (Llama/Qwen2/Mistral/Phi-3, GPT-2, GPT-NeoX, Phi, OPT).
FINAL_NORMS = ("model.norm", "transformer.ln_f", "gpt_neox.final_layer_norm", "model.final_layernorm",
               "model.decoder.final_layer_norm")


def find_final_norm(model: nn.Module) -> nn.Module | None:
    """The norm applied before the output head (`FINAL_NORMS`), or None for a family it does not know."""
    for path in FINAL_NORMS:
        module = model
        for part in path.split("."):
            module = getattr(module, part, None)
            if module is None:
                break
        if isinstance(module, nn.Module):
            return module
    return None
