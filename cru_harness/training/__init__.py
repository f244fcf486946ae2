"""The training engine, one loop for every method that trains weights (`engine.py`, on accelerate), what a method
gives it (`objective.py`), resource records (`resources.py`) and a decoder's anatomy (`blocks.py`, `sites.py`).
Below `cru` and `baselines`, which both train through it and never import each other."""
import importlib

# Exported lazily (PEP 562): the command line's parsers import `training.lora` for their flags, and listing the
# registries (`cru-harness methods`) must not import accelerate, transformers and peft through this __init__.
_EXPORTS = {"Engine": ".engine", "TrainResult": ".engine", "make_accelerator": ".engine",
            "prepare_training": ".engine", "train_model": ".engine", "IGNORE_INDEX": ".objective",
            "Objective": ".objective", "TrainingConfig": ".objective", "default_counts": ".objective"}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


__all__ = list(_EXPORTS)
