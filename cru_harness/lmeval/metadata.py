"""The lm-eval metadata keys the project's TOFU and RWKU tasks read (`--metadata '{...}'`, `TaskManager(metadata=...)`),
and the check that refuses a misspelt one.

lm-eval hands each task the whole run's metadata merged with the model's `--model_args` and its own keys
(`version`, ...), and one command may run both suites (`--tasks tofu_forget10,rwku_aa`), so an unknown key cannot
be refused as such. A key with a suite's prefix that neither suite reads is a misspelling, though, and would leave
the default in force (`rwku_target` evaluates target 1): `check_metadata_keys` refuses it. No `cru`/`hf` model
argument or lm-eval key starts with these prefixes. Stdlib only (the task files import it).
"""
from __future__ import annotations

import difflib
from collections.abc import Mapping

from cru_harness.errors import InputError

#: Read by the TOFU tasks (tasks/tofu/utils.py); `tofu_config` comes from each task's YAML, not the metadata.
TOFU_METADATA_KEYS = ("tofu_preset", "tofu_model_family")
#: Read by the in-context attack's TOFU task variants (`tofu_forgetXX_in_context`): k, the slice, its seed.
TOFU_IN_CONTEXT_KEYS = ("tofu_icl_k", "tofu_icl_slice_fraction", "tofu_icl_slice_size", "tofu_icl_seed")
#: Read by the RWKU tasks (tasks/rwku/utils.py); `rwku_probe` comes from each task's YAML, not the metadata.
RWKU_METADATA_KEYS = ("rwku_targets", "rwku_items_per_target", "rwku_utility_missing", "rwku_preset",
                      "rwku_newline_stop")
#: Every key the project's tasks read from the metadata (`data_dir`: both suites).
#: Read by the single-author TOFU tasks (tofu_author_forget / _retain): LUNAR's author number, default 1.
TOFU_AUTHOR_METADATA_KEYS = ("tofu_author",)
METADATA_KEYS = (("data_dir",) + TOFU_METADATA_KEYS + RWKU_METADATA_KEYS + TOFU_AUTHOR_METADATA_KEYS +
                 TOFU_IN_CONTEXT_KEYS)
#: Keys with these prefixes must be in METADATA_KEYS.
SUITE_PREFIXES = ("tofu_", "rwku_")
#: Set by each task's YAML (`dataset_kwargs`), never by the metadata: the task one runs chooses them.
TASK_KEYS = {"tofu_config": "the TOFU task chooses the split (tofu_forget01, tofu_forget10, tofu_retain, ...)",
             "tofu_author_set": "the TOFU task chooses the set (tofu_author_forget, tofu_author_retain)",
             "tofu_variant": "the TOFU task chooses the attack variant (tofu_forget10_paraphrase, "
                             "tofu_forget10_in_context, ...)",
             "rwku_probe": "the RWKU task chooses the probe (rwku_fb, rwku_qa, rwku_aa, rwku_mia, ...)"}


def check_metadata_keys(metadata: Mapping) -> None:
    """Refuse a `tofu_`/`rwku_` key that is not in METADATA_KEYS (an `InputError` naming it, a close match and the
    valid keys), and a key the task's own YAML sets (`TASK_KEYS`); any other key (model arguments, lm-eval's own,
    another tool's) passes. Called where lm-eval builds its TaskManager (before it loads the model) and again by
    each task's loader (a TaskManager built elsewhere)."""
    for key in sorted(k for k in metadata if isinstance(k, str)):
        if key in TASK_KEYS:
            raise InputError(f"--metadata key {key!r} is not a setting: {TASK_KEYS[key]}")
        if key.startswith(SUITE_PREFIXES) and key not in METADATA_KEYS:
            close = difflib.get_close_matches(key, METADATA_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InputError(f"unknown --metadata key {key!r}{hint}; the TOFU and RWKU tasks read "
                             f"{', '.join(METADATA_KEYS)}")


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
