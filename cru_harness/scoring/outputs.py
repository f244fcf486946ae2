"""Reading lm-eval's output files, for every benchmark's scorer: `ScoreInputError` (a file that cannot be read at
all), `jsonl_rows` (a `samples_<task>_<date>.jsonl` or a `per_item.jsonl`, line by line) and `generation_prompt`
(what a sample's generation started from, in either of lm-eval's sample layouts)."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError


class ScoreInputError(UserError, ValueError):
    """An input that cannot be read at all (no lm-eval results in a directory, a malformed file)."""


def generation_prompt(arguments) -> str | None:
    """The context of a sample's first request (the generation). lm-eval's in-memory samples hold
    `[[ctx, gen_kwargs], ...]`; its samples files hold `{"gen_args_0": {"arg_0": ctx, "arg_1": ...}, ...}`."""
    if isinstance(arguments, dict):
        first = arguments.get("gen_args_0") or {}
        return first.get("arg_0") if isinstance(first, dict) else None
    if isinstance(arguments, list) and arguments and isinstance(arguments[0], (list, tuple)) and arguments[0]:
        return arguments[0][0]
    return None


def jsonl_rows(path: Path):
    """(line number, row) of a JSON-lines file, skipping blank lines; a bad line is a ScoreInputError naming it."""
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as err:
                raise ScoreInputError(f"{path}:{line_no}: not valid JSON ({err})") from err
