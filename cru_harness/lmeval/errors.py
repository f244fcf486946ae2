"""Under lm-eval's command line, the project's own errors (`cru_harness.errors.UserError`: a bundle, a base
fingerprint, data, RWKU target selection, a `--model_args` entry) are printed as one line, as `cru-harness`
prints them; anything else keeps lm-eval's traceback.

lm-eval 0.4.13 lets every exception from model construction and task loading propagate to the interpreter,
so this is a `sys.excepthook` wrapper, installed when lm-eval's command line is imported (the `.pth` hook
watches `lm_eval._cli`) and by `cru-eval`. Library use (`simple_evaluate`) still gets the exception itself.
Stdlib only: loaded from the start-up hook.
"""
from __future__ import annotations

import os
import sys

_FLAG = "_cru_harness_user_errors"


def program_name() -> str:
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name and name not in ("__main__.py", "-c", "-m") else "lm_eval"


def install_excepthook() -> None:
    """Wrap `sys.excepthook` once: a `UserError` becomes `<prog>: error: <message>` (exit status 1)."""
    if getattr(sys.excepthook, _FLAG, False):
        return
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        from cru_harness.errors import UserError, report_user_error

        if isinstance(exc, UserError):
            report_user_error(program_name(), exc)
            return
        previous(exc_type, exc, tb)

    setattr(hook, _FLAG, True)
    sys.excepthook = hook
