"""The privacy reference model of the `cru` model (`reference=`): the reference attack's model (open-unlearning's
TOFU config names the retain model), loaded once on first use in the scored model's dtype and device."""
from __future__ import annotations

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
