"""lm-evaluation-harness integration: the `cru` model, lazy registration (.pth hook) and `cru-eval`.

Kept import-light on purpose (the start-up hook and task `process_results` functions import from here):
`CRULM` and `register` are resolved lazily on first attribute access.

- `model.CRULM` (`--model cru`): `base=`, `routers=dirA+dirB`, every HFLM argument passed through.
- `protocol`: `EOS_MARKER`, `LoglikelihoodResult`, `RollingResult`, `has_token_stats`, date pinning.
- `registration`: `register()`, `patch_task_manager()`, `tasks_dir()`.
- `cli.main`: the `cru-eval` console script (lm-eval's CLI after explicit registration).

See docs/lm_eval.md for what `--model hf` can and cannot report with the project's tasks.
"""
from __future__ import annotations

from cru_harness.protocol import (  # noqa: F401  (plain Python, cheap)
    EOS_MARKER,
    LoglikelihoodResult,
    RollingResult,
    has_token_stats,
)

__all__ = ["CRULM", "EOS_MARKER", "LoglikelihoodResult", "RollingResult", "has_token_stats", "register",
           "tasks_dir"]


def __getattr__(name):
    if name == "CRULM":
        from cru_harness.lmeval.model import CRULM

        return CRULM
    if name in ("register", "tasks_dir"):
        from cru_harness.lmeval import registration

        return getattr(registration, name)
    raise AttributeError(f"module 'cru_harness.lmeval' has no attribute {name!r}")
