"""The training engine, one loop for every method that trains weights (`engine.py`, on accelerate), what a method
gives it (`objective.py`), resource records (`resources.py`) and a decoder's anatomy (`blocks.py`, `sites.py`).
Below `cru` and `baselines`, which both train through it and never import each other."""
from ..lazy import lazy_exports

# Exported lazily (PEP 562): the command line's parsers import `training.lora` for their flags, and listing the
# registries (`cru-harness methods`) must not import accelerate, transformers and peft through this __init__.
_EXPORTS = {"Engine": ".engine", "TrainResult": ".engine", "make_accelerator": ".engine",
            "prepare_training": ".engine", "train_model": ".engine", "IGNORE_INDEX": ".objective",
            "Objective": ".objective", "TrainingConfig": ".objective", "default_counts": ".objective"}


__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)


__all__ = list(_EXPORTS)
