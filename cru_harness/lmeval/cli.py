"""`cru-eval`: lm-eval's own command line, after registering `cru` and the project's tasks explicitly.

Takes exactly `lm_eval`'s arguments (`cru-eval --model cru --model_args base=...,routers=... --tasks ...`,
`cru-eval ls tasks`, ...). It is the route that does not depend on the `.pth` start-up hook (e.g. when the hook
is disabled with `CRU_HARNESS_NO_LMEVAL_HOOK=1`, or the package sits on `PYTHONPATH` instead of being installed).
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from cru_harness.lmeval.errors import install_excepthook
    from cru_harness.lmeval.registration import patch_output_name, patch_task_manager, register

    install_excepthook()
    register()
    patch_task_manager()
    patch_output_name()
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0] if sys.argv else "cru-eval", *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
