"""Start-up import hook, run by `cru_harness_lmeval.pth` in site-packages (stdlib only; do not import directly).

The `.pth` loads this file by path under the module name `_cru_harness_lmeval_hook` without importing the
`cru_harness` package, and calls `install()`, which puts one `sys.meta_path` finder in place. Until lm-eval is
imported the finder costs one dictionary lookup per import. When one of the watched lm-eval modules finishes
executing, the finder calls into `cru_harness.lmeval.registration`:

- `lm_eval.api.registry` -> `register()`: imports `lm_eval.models` (built-ins stay registered) and registers `cru`
  lazily (the model module, torch and transformers load only when `cru` is actually used);
- `lm_eval.tasks.manager` (and `lm_eval.tasks`, as a fallback) -> `patch_task_manager()`;
- `lm_eval.loggers.evaluation_tracker` -> `patch_output_name()`: `base=` names the output folder;
- `lm_eval._cli` (the `lm_eval` command line only) -> `cru_harness.lmeval.errors.install_excepthook()`: the
  project's own errors print as one line.

A failure inside the hook is reported on stderr once and never breaks lm-eval itself; `cru-eval` remains the
explicit route. `CRU_HARNESS_NO_LMEVAL_HOOK=1` disables the hook.
"""
from __future__ import annotations

import os
import sys

ENV_DISABLE = "CRU_HARNESS_NO_LMEVAL_HOOK"


def _register():
    from cru_harness.lmeval import registration

    registration.register()


def _output_name():
    from cru_harness.lmeval import registration

    registration.patch_output_name()


def _user_errors():
    from cru_harness.lmeval.errors import install_excepthook

    install_excepthook()


def _patch_tasks():
    from cru_harness.lmeval import registration

    registration.patch_task_manager()


_ACTIONS = {
    "lm_eval.api.registry": _register,
    "lm_eval.tasks.manager": _patch_tasks,
    "lm_eval.tasks": _patch_tasks,
    "lm_eval.loggers.evaluation_tracker": _output_name,   # `base=` names the output folder
    "lm_eval._cli": _user_errors,   # lm-eval's command line: the project's errors as one line
}


class _LoaderProxy:
    """Runs the real loader, then the action for the module it just executed."""

    def __init__(self, loader, action):
        self._loader = loader
        self._action = action

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _run_action(self._action, module.__name__)

    def __getattr__(self, name):  # get_code, get_source, is_package, ... for tools that ask
        return getattr(self._loader, name)


def _run_action(action, module_name: str) -> None:
    try:
        action()
    except Exception as exc:  # never break lm-eval because of us, but say so
        print(f"cru-harness: lm-eval integration hook failed after importing {module_name}: "
              f"{type(exc).__name__}: {exc}. Use `cru-eval` instead of `lm_eval`, or call "
              f"cru_harness.lmeval.registration.register().", file=sys.stderr)


class LmEvalFinder:
    """A `sys.meta_path` finder that only ever answers for the watched lm-eval module names."""

    def __init__(self):
        self._busy = set()

    def find_spec(self, fullname, path=None, target=None):
        action = _ACTIONS.get(fullname)
        if action is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)  # the real spec, from the finders after us
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _LoaderProxy(spec.loader, action)
        return spec


def install() -> None:
    if os.environ.get(ENV_DISABLE):
        return
    if any(isinstance(f, LmEvalFinder) or type(f).__name__ == "LmEvalFinder" for f in sys.meta_path):
        return
    sys.meta_path.insert(0, LmEvalFinder())
    # lm-eval already imported (e.g. the hook installed late, by hand): act now.
    for name, action in _ACTIONS.items():
        if name in sys.modules:
            _run_action(action, name)
