"""The lm-eval metadata keys the benchmarks' tasks read (`--metadata '{...}'`, `TaskManager(metadata=...)`), and the
check that refuses a misspelt one.

Each benchmark plugin declares its keys (`Benchmark.metadata_keys`), the prefixes that mark a key as its own
(`metadata_prefixes`) and the keys its task YAMLs set (`task_keys`). lm-eval hands each task the whole run's
metadata merged with the model's `--model_args` and its own keys (`version`, ...), and one command may run several
suites, so an unknown key cannot be refused as such. A key with a benchmark's prefix that no benchmark reads is a
misspelling, though, and would leave the default in force: `check_metadata_keys` refuses it. No `cru`/`hf` model
argument or lm-eval key starts with these prefixes. The keys are read from the registry when first asked for (the
task files import this module).
"""
from __future__ import annotations

import difflib
from collections.abc import Mapping

from cru_harness.errors import InputError

#: Read by every benchmark's tasks that read data: the local data folder.
COMMON_METADATA_KEYS = ("data_dir",)


def metadata_keys() -> tuple[str, ...]:
    """Every key the registered benchmarks' tasks read from the metadata (`data_dir` first)."""
    from .. import plugins

    keys = [*COMMON_METADATA_KEYS]
    for plugin in plugins.benchmarks:
        keys.extend(plugin.metadata_keys)
    return tuple(dict.fromkeys(keys))


def suite_prefixes() -> tuple[str, ...]:
    """Keys with these prefixes must be in `metadata_keys()` (the benchmarks' `metadata_prefixes`)."""
    from .. import plugins

    return tuple(dict.fromkeys(prefix for plugin in plugins.benchmarks for prefix in plugin.metadata_prefixes))


def task_keys() -> dict[str, str]:
    """Keys the task YAMLs set (`dataset_kwargs`), never the metadata: key -> which task chooses it."""
    from .. import plugins

    found: dict[str, str] = {}
    for plugin in plugins.benchmarks:
        for key, why in plugin.task_keys.items():
            found.setdefault(key, why)
    return found


def __getattr__(name: str):
    """`METADATA_KEYS`, `SUITE_PREFIXES`, `TASK_KEYS`: the registry's, read when first used."""
    computed = {"METADATA_KEYS": metadata_keys, "SUITE_PREFIXES": suite_prefixes, "TASK_KEYS": task_keys}
    if name in computed:
        return computed[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_metadata_keys(metadata: Mapping) -> None:
    """Refuse a key with a benchmark's prefix that no benchmark reads (an `InputError` naming it, a close match and
    the valid keys), and a key a task's own YAML sets (`task_keys()`); any other key (model arguments, lm-eval's
    own, another tool's) passes. Called where lm-eval builds its TaskManager (before it loads the model) and again
    by each task's loader (a TaskManager built elsewhere)."""
    keys = [k for k in metadata if isinstance(k, str)]
    if not keys:
        return
    own, prefixes, valid = task_keys(), suite_prefixes(), metadata_keys()
    for key in sorted(keys):
        if key in own:
            raise InputError(f"--metadata key {key!r} is not a setting: {own[key]}")
        if prefixes and key.startswith(prefixes) and key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InputError(f"unknown --metadata key {key!r}{hint}; the benchmarks' tasks read "
                             f"{', '.join(valid)}")


def metadata_flag(value, key: str) -> bool:
    """A yes/no metadata value: a JSON boolean, or the strings true/false (yes/no, 1/0) a shell or an env var gives;
    anything else is an `InputError` (the string "false" would otherwise read as true)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0", ""):
        return False
    raise InputError(f"--metadata {key}={value!r}: expected true or false")


def metadata_count(value, key: str) -> int | None:
    """A row count in the metadata: a positive integer (or its digits); None, "" and 0 mean no limit. Anything else
    is an `InputError` (-1 would otherwise drop each file's last row, "abc" end in a traceback)."""
    if value in (None, "", 0, "0"):
        return None
    if isinstance(value, bool) or not (isinstance(value, int) or str(value).strip().isdigit()) or int(value) < 1:
        raise InputError(f"--metadata {key}={value!r}: expected a positive integer (or 0 for every row)")
    return int(value)
