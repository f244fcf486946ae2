"""Moved to `cru_harness.protocol` (layering: the prompt protocol's constants serve prompts and tasks below lm-eval); this name stays importable."""
from ..protocol import *  # noqa: F401,F403


def __getattr__(name: str):
    import importlib

    return getattr(importlib.import_module("cru_harness.protocol"), name)
