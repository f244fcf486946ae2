"""The project's user errors and how they are reported: one line naming the problem, no traceback.

Every error a user can cause with bad input (a bundle, a config, data, a target list, a model argument, an
output location) derives from `UserError`, whatever builtin type it also is (most are also `ValueError`, so
code catching those keeps working; `InputError` and `MissingInputError` serve where no more specific type
fits). Both command lines report them, and only them, through `report_user_error`: `cru-harness` (cli.py)
and, under lm-eval, `lm_eval` / `cru-eval` (lmeval/errors.py). Anything else, a plain ValueError included, is
a bug and keeps its traceback. Stdlib only: imported at start-up.
"""
from __future__ import annotations

import errno
import sys


class UserError(Exception):
    """Bad input from the user (not a bug): reported as one line by the command lines."""


class InputError(UserError, ValueError):
    """A value the user gave that cannot be used: an argument, a config entry, a hyperparameter, a data spec."""


class MissingInputError(UserError, FileNotFoundError):
    """A file or directory the user named that is not there."""


class TargetSelectionError(UserError, ValueError):
    """A benchmark's unit selection (RWKU's target list or `select_known`) that selects nothing valid. Here, not in
    the benchmark's package, because the runner reports a failed selection under this name."""


class OutputWriteError(UserError, OSError):
    """A file the project writes could not be written for a reason of the machine's, not the code's: the disk or
    quota is full, the file system is read-only, permission is denied."""


#: The errnos of OSError that `OutputWriteError` stands for.
WRITE_ERRNOS = frozenset(getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM")
                         if hasattr(errno, name))


def excerpt(value, limit: int = 200) -> str:
    """`repr(value)` cut to about `limit` characters, saying how long it was: what an error message shows of a
    value the user gave (a value echoed whole would make an error line as long as the input allows)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def one_line(err: BaseException) -> str:
    """The message of `err` on one line (a multi-line message is joined, so the report stays one line)."""
    return " ".join(part.strip() for part in str(err).splitlines() if part.strip()) or type(err).__name__


#: The longest error line a command prints: whatever a message echoes (a 200,000-character name), the line stays
#: readable; the cut says how much was left out.
MAX_ERROR_LINE = 2000


def bounded(text: str, limit: int = MAX_ERROR_LINE) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters left out)"


def report_user_error(prog: str, err: BaseException, stream=None) -> None:
    print(f"{prog}: error: {bounded(one_line(err))}", file=stream or sys.stderr)
