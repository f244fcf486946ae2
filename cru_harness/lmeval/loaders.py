"""Which loader a saved model needs: a method whose saved model is not one checkpoint says so through its
`Method.model_loader` hook (WHP: two models whose logits combine), so the `cru` model serves it without knowing
any method. Every other directory or Hub id is one checkpoint, loaded as HFLM loads it."""
from __future__ import annotations

from pathlib import Path


def model_loader(pretrained):
    """The `cru_harness.api.ModelLoader` a registered method gives for `pretrained` (a local directory), or None."""
    if not isinstance(pretrained, (str, Path)) or not Path(pretrained).expanduser().is_dir():
        return None
    from cru_harness import plugins

    for method in plugins.methods:
        loader = method.model_loader(str(pretrained))
        if loader is not None:
            return loader
    return None
