"""The training engine, one loop for every method that trains weights (`engine.py`, on accelerate), what a method
gives it (`objective.py`), resource records (`resources.py`) and a decoder's anatomy (`blocks.py`, `sites.py`).
Below `cru` and `baselines`, which both train through it and never import each other."""
from .engine import Engine, TrainResult, make_accelerator, prepare_training, train_model
from .objective import IGNORE_INDEX, Objective, TrainingConfig, default_counts

__all__ = ["Engine", "TrainResult", "make_accelerator", "prepare_training", "train_model", "IGNORE_INDEX",
           "Objective", "TrainingConfig", "default_counts"]
