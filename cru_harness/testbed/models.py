"""Build tiny, randomly initialised Hugging Face causal LMs of several families, offline.

They are real `transformers` models (saved with `save_pretrained`, reloaded through the Auto classes), just
small: ~8 decoder blocks so that "the last 4 blocks" is half the network, not most of it.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    Phi3Config,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    Qwen2Config,
)

from ..errors import InputError

TINY_ARCHITECTURES = ("llama", "qwen2", "gpt2", "phi3", "gpt_neox")


def tiny_config(arch: str, tokenizer: PreTrainedTokenizerBase, *, n_layers: int = 8, hidden_size: int = 64,
                n_heads: int = 4, max_positions: int = 512) -> PretrainedConfig:
    """The config of a tiny model of family `arch` whose special tokens match `tokenizer`."""
    special = dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    intermediate = 4 * hidden_size
    if arch == "llama":
        return LlamaConfig(hidden_size=hidden_size, intermediate_size=intermediate, num_hidden_layers=n_layers,
                           num_attention_heads=n_heads, num_key_value_heads=n_heads,
                           max_position_embeddings=max_positions, **special)
    if arch == "qwen2":
        return Qwen2Config(hidden_size=hidden_size, intermediate_size=intermediate, num_hidden_layers=n_layers,
                           num_attention_heads=n_heads, num_key_value_heads=n_heads // 2,
                           max_position_embeddings=max_positions, **special)
    if arch == "phi3":
        return Phi3Config(hidden_size=hidden_size, intermediate_size=intermediate, num_hidden_layers=n_layers,
                          num_attention_heads=n_heads, num_key_value_heads=n_heads,
                          max_position_embeddings=max_positions, original_max_position_embeddings=max_positions,
                          **special)
    if arch == "gpt2":
        return GPT2Config(n_embd=hidden_size, n_layer=n_layers, n_head=n_heads, n_positions=max_positions,
                          n_inner=intermediate, **special)
    if arch == "gpt_neox":
        return GPTNeoXConfig(hidden_size=hidden_size, intermediate_size=intermediate, num_hidden_layers=n_layers,
                             num_attention_heads=n_heads, max_position_embeddings=max_positions, **special)
    raise InputError(f"unknown tiny architecture {arch!r}; choose one of {', '.join(TINY_ARCHITECTURES)}")


def build_tiny_model(arch: str, tokenizer: PreTrainedTokenizerBase, *, seed: int = 0, **config_kwargs):
    """A randomly initialised causal LM of family `arch` (deterministic for a given seed), in float32."""
    config = tiny_config(arch, tokenizer, **config_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


def save_tiny_model(model, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """Save model and tokenizer side by side, the layout `from_pretrained` and lm-eval expect."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
