"""TOFU's fine-tuning recipe: `finetune(model, data, out_dir, ...)`, `FinetuneConfig`, `cru-harness finetune`.

Names are loaded on first use so that `cru-harness --help` does not import torch.
"""
from __future__ import annotations

_PUBLIC = ("finetune", "FinetuneConfig", "FinetuneResult", "QADataset", "SupervisedFinetune", "RECORD_FILE")
__all__ = list(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        from . import train

        return getattr(train, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
