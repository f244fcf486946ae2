"""MUSE (Shi et al. 2024, swj0419/muse_bench): News (BBC articles) and Books (Harry Potter), scored on MUSE's six
criteria. A benchmark package: its data loading (`data`), prompts (`prompts`), scorers (`metrics`), its lm-eval task
folder (`tasks/`) and its runner plugin (`plugin`). Importing the package itself stays light (no torch, no lm-eval):
lm-eval's task loader and the registries import only what they name."""
from __future__ import annotations

from pathlib import Path


def tasks_dir() -> str:
    """The MUSE task folder (lm-eval `--include_path`; the `lm_eval.tasks` entry point `muse`)."""
    return str(Path(__file__).resolve().parent / "tasks")
