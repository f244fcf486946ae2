"""The privacy reference model of the `cru` model (`reference=`): the reference attack's model (open-unlearning's
TOFU config names the retain model), loaded once on first use in the scored model's dtype and device."""
from __future__ import annotations

import json
from pathlib import Path

from cru_harness.errors import excerpt

from .arguments import ModelArgumentError


class ReferenceModel:
    """`reference=<HF id, directory or testbed name>`, loaded when the first score asks for it."""

    def __init__(self, source) -> None:
        self.source = str(source)
        self._model = None

    def load(self, like, tokenizer, device):
        """The reference model, in `like`'s dtype on `device`; a vocabulary smaller than `tokenizer`'s is refused
        (the attack compares losses on the same tokens)."""
        if self._model is None:
            from transformers import AutoModelForCausalLM

            from cru_harness.testbed.names import resolve_model_path

            model = AutoModelForCausalLM.from_pretrained(resolve_model_path(self.source),
                                                         dtype=like.dtype).to(device).eval()
            if model.get_input_embeddings().num_embeddings < len(tokenizer):
                raise ModelArgumentError(f"cru model: reference={self.source} has another vocabulary than the "
                                         "scored model's tokenizer: the reference attack compares losses on the "
                                         "same tokens")
            self._model = model
        return self._model


#: Files whose content fixes a tokenizer's vocabulary and ids: equal files, equal tokenizers.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "spiece.model")


def check_reference_model(reference, tokenizer_source, *, trust_remote_code=False) -> str:
    """The `reference=` model of the privacy metrics' reference attack, checked before any model loads: a local
    model directory (or a Hub id), whose tokenizer gives the evaluated model's ids (the attack compares losses on
    the same token ids). Tokenizer files compared by content; when they differ, both tokenizers (not the weights)
    are loaded and their vocabularies and a few encodings compared. Returns the resolved path."""
    from cru_harness.locations import check_model_path
    from cru_harness.testbed.names import resolve_model_path

    if isinstance(reference, (str, Path)):
        path = check_model_path(resolve_model_path(str(reference)), what="reference model (reference=)")
    else:
        raise ModelArgumentError(f"cru model: reference= must name a model directory or Hub id, not "
                                 f"{type(reference).__name__}")
    ref, base = Path(path).expanduser(), Path(str(tokenizer_source)).expanduser()
    if not (ref.is_dir() and base.is_dir()):
        return path   # a Hub id: its files are not here to compare; the run-time vocabulary check still holds

    def files(directory):
        return {name: (directory / name).read_bytes() for name in _TOKENIZER_FILES if (directory / name).is_file()}

    ref_files, base_files = files(ref), files(base)
    if ref_files and ref_files == base_files:
        return path
    if not ref_files:   # a checkpoint saved without its tokenizer: its embedding size must match at least
        sizes = []
        for directory in (ref, base):
            try:
                sizes.append(json.loads((directory / "config.json").read_text(encoding="utf-8")).get("vocab_size"))
            except (OSError, ValueError, AttributeError):
                sizes.append(None)
        if None not in sizes and sizes[0] != sizes[1]:
            raise ModelArgumentError(f"cru model: reference={excerpt(reference, 200)} has vocab_size {sizes[0]}, the "
                                     f"evaluated model {sizes[1]}: the reference attack compares losses on the same "
                                     "token ids, so the reference model needs the evaluated model's tokenizer")
        return path
    from transformers import AutoTokenizer

    toks = []
    for directory, what in ((ref, f"reference={excerpt(reference, 200)}"), (base, f"tokenizer {base}")):
        try:
            toks.append(AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code))
        except (OSError, ValueError, TypeError) as err:
            raise ModelArgumentError(f"cru model: cannot read the tokenizer of {what}: "
                                     f"{excerpt(str(err).splitlines()[0] if str(err) else type(err).__name__, 200)}"
                                     ) from err
    samples = ("The quick brown fox jumps over the lazy dog.", "Who wrote 'Le Petit Prince' in 1943? 42 \u00e9t\u00e9")
    if toks[0].get_vocab() != toks[1].get_vocab() or any(
            toks[0].encode(text) != toks[1].encode(text) for text in samples):
        raise ModelArgumentError(f"cru model: reference={excerpt(reference, 200)} has another tokenizer than the "
                                 f"evaluated model ({len(toks[0])} vs {len(toks[1])} tokens, or other ids): the "
                                 "reference attack compares losses on the same token ids")
    return path
