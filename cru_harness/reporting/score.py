"""Moved to `cru_harness.scoring.score` (scoring sits below reporting: the runner scores a cell without the report
layer); this name stays importable."""
from ..scoring.score import *  # noqa: F401,F403


def __getattr__(name: str):
    import importlib

    return getattr(importlib.import_module("cru_harness.scoring.score"), name)
