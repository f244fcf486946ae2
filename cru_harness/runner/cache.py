"""Moved to `cru_harness.store` (layering: the results store is foundation I/O, read by reporting and the runner
alike); this name stays importable."""
from ..store import *  # noqa: F401,F403


def __getattr__(name: str):
    import importlib

    return getattr(importlib.import_module("cru_harness.store"), name)
