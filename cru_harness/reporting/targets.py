"""Where a run keeps its RWKU target choices (`select_known`, made by `runner.targets`) and the ranking rule they
follow, which the report reads back to say why the targets are these."""
from __future__ import annotations

SELECTION_DIR = "target_selection"


def rank_targets(scores: dict[int, float], top: int) -> list[int]:
    """The `top` targets by knowledge score, highest first; ties keep the lower target index."""
    return [t for t, _ in sorted(scores.items(), key=lambda item: (-item[1], item[0]))][:top]
