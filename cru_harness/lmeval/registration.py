"""Make lm-eval 0.4.13 see the `cru` model and the project's tasks.

lm-eval 0.4.13 has no plugin discovery (it ignores the `lm_eval.models` / `lm_eval.tasks` entry points this
package declares for later versions), so two things are patched in, both idempotent:

- `register()`: registers `cru` in lm-eval's model registry as a lazy placeholder
  (`cru_harness.lmeval.model:CRULM`, imported only when `cru` is asked for). It imports `lm_eval.models` first:
  registering into a still-empty registry would stop `get_model` from filling in the built-ins (`hf`, ...).
- `patch_task_manager()`: every `TaskManager(...)` that includes lm-eval's built-in tasks (the default,
  `include_defaults=True`) also indexes `task_paths()` (`tasks_dir()` and each benchmark plugin's task folder), so `--tasks tofu_forget10,rwku_aa` resolve without
  `--include_path`. Names the user passes with `--include_path` are indexed after ours and win on a clash.
  It also checks the metadata's keys (`metadata.check_metadata_keys`) there: lm-eval's command line builds its
  TaskManager before loading the model, so a misspelt `tofu_`/`rwku_` key fails before the load.

- `patch_output_name()`: lm-eval names the folder under `--output_path` after `pretrained=` (and a few other
  arguments) and after a random string otherwise; `base=`, the `cru` model's name for `pretrained=`, names it too.

Who calls them: the `.pth` import hook (`_hook.py`, installed into site-packages) when lm-eval's modules are
imported; `cru-eval` (`cli.py`) explicitly; importing `cru_harness.lmeval.model` calls `register()` too.
Set `CRU_HARNESS_NO_LMEVAL_HOOK=1` to switch the `.pth` hook off (then use `cru-eval` or call these yourself).
"""
from __future__ import annotations

import functools
import logging
import re
from pathlib import Path

from .metadata import check_metadata_keys

MODEL_NAME = "cru"
MODEL_TARGET = "cru_harness.lmeval.model:CRULM"


def tasks_dir() -> str:
    """The folder holding the built-in benchmark packages (`cru_harness/benchmarks`), each with its lm-eval task
    folder inside (`tofu/tasks`, `rwku/tasks`, `muse/tasks`): lm-eval indexes the YAMLs under it recursively."""
    return str(Path(__file__).resolve().parents[1] / "benchmarks")


def task_paths() -> list[str]:
    """The task folders lm-eval indexes for the project: `tasks_dir()` and every registered benchmark's own folder
    (`Benchmark.task_folder`) that does not lie inside it (a third-party benchmark package's)."""
    from .. import plugins

    ours = Path(tasks_dir())
    paths = [str(ours)]
    for plugin in plugins.benchmarks:
        folder = plugin.task_folder
        if folder and ours not in (Path(folder).resolve(), *Path(folder).resolve().parents):
            paths.append(str(Path(folder).resolve()))
    return list(dict.fromkeys(paths))


def register() -> None:
    """Register `cru` (lazily) without hiding lm-eval's built-in models. Safe to call any number of times."""
    import lm_eval.models  # noqa: F401  (fills the registry with the built-ins first)
    from lm_eval.api.registry import model_registry

    if MODEL_NAME in model_registry:
        return
    try:
        model_registry.register(MODEL_NAME, target=MODEL_TARGET)
    except TypeError as exc:  # a frozen registry (freeze_all) is a MappingProxy
        raise RuntimeError(
            f"cannot register the '{MODEL_NAME}' model: lm-eval's model registry is frozen. Import "
            f"cru_harness.lmeval.registration and call register() before lm_eval.api.registry.freeze_all()."
        ) from exc


_PATCH_FLAG = "_cru_harness_patched"


def patch_task_manager(task_manager_cls=None) -> None:
    """Make `TaskManager(include_defaults=True, ...)` also index `tasks_dir()`, and check its metadata's keys
    (`check_metadata_keys`). Idempotent."""
    if task_manager_cls is None:
        from lm_eval.tasks.manager import TaskManager as task_manager_cls
    if getattr(task_manager_cls.__init__, _PATCH_FLAG, False):
        return
    original = task_manager_cls.__init__

    @functools.wraps(original)
    def __init__(self, verbosity=None, include_path=None, include_defaults=True, metadata=None, *args, **kwargs):
        # lm-eval's command line builds the TaskManager before it loads the model: a misspelt key fails here in
        # seconds, not after the load (and before lm-eval's own "multiple values" crash on a YAML-set key).
        check_metadata_keys(metadata or {})
        if include_defaults:
            include_path = with_project_tasks(include_path)
        original(self, verbosity, include_path, include_defaults, metadata, *args, **kwargs)

    setattr(__init__, _PATCH_FLAG, True)
    task_manager_cls.__init__ = __init__
    quiet_opposite_directions()


#: lm-eval's warning when a group's tasks give one metric opposite directions ("Higher_is_better values for metric
#: rouge_l_recall in group tofu_forget10_suite are not consistent"). The project's TOFU and RWKU groups put forget
#: tasks (lower ROUGE-L is better) beside retain and utility tasks (higher is better) on purpose, and define no group
#: score, so the direction lm-eval then drops is read by nothing: the four warnings a run printed said nothing.
_OPPOSITE = re.compile(r"Higher_is_better values for metric \S+ in group (?P<group>\S+) are not consistent")


class _ProjectGroupDirections(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        match = _OPPOSITE.match(record.getMessage())
        return not (match and project_group(match.group("group")))


def project_group(name: str) -> bool:
    """Whether a group is one of the built-in benchmarks' (their `tasks/` folders), whose forget and retain tasks
    point their shared metrics opposite ways by design."""
    return any(path.stem == name for path in Path(tasks_dir()).rglob("*.yaml"))


def quiet_opposite_directions() -> None:
    """Drop lm-eval's direction warning for the project's own groups only (`_OPPOSITE`); other groups keep it."""
    logger = logging.getLogger("lm_eval.evaluator_utils")
    if not any(isinstance(f, _ProjectGroupDirections) for f in logger.filters):
        logger.addFilter(_ProjectGroupDirections())


def with_project_tasks(include_path):
    """`include_path` (None, a path or a list) with the project's task folders (`task_paths()`) put first."""
    if include_path is None:
        paths = []
    elif isinstance(include_path, (list, tuple)):
        paths = list(include_path)
    else:
        paths = [include_path]
    resolved = {str(Path(p).resolve()) for p in paths}
    missing = [path for path in task_paths() if path not in resolved]
    if not missing:
        return include_path
    return [*missing, *paths]


def is_registered() -> bool:
    from lm_eval.api.registry import model_registry

    return MODEL_NAME in model_registry


def base_argument(model_args) -> str | None:
    """The `base=` of `--model_args` (a string as lm-eval's command line passes it, or a dict), else None."""
    if isinstance(model_args, dict):
        value = model_args.get("base")
    elif isinstance(model_args, str):
        from lm_eval.utils import simple_parse_args_string

        try:
            value = simple_parse_args_string(model_args).get("base")
        except ValueError:   # a malformed string: lm-eval itself says so when it builds the model
            return None
    else:
        return None
    return None if value is None else str(value)


def patch_output_name(tracker_cls=None) -> None:
    """Make lm-eval's output folder name (`GeneralConfigTracker._get_model_name`) read `base=` where it finds no
    name of its own, so `base=X` names the folder `X` (sanitised) as `pretrained=X` does. Idempotent."""
    if tracker_cls is None:
        from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker as tracker_cls
    original = tracker_cls._get_model_name
    if getattr(original, _PATCH_FLAG, False):
        return

    @functools.wraps(original)
    def _get_model_name(model_args):
        return original(model_args) or base_argument(model_args)

    setattr(_get_model_name, _PATCH_FLAG, True)
    tracker_cls._get_model_name = staticmethod(_get_model_name)
