"""Helpers every subcommand's parser uses (`cru-harness` and the packages' own `register(subparsers)`): flags that
stand for a config dataclass's fields, and the command lines' error type. Foundation layer: a package's command
line imports this, never `cru_harness.cli` (the top of the layers)."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Callable

from cru_harness.errors import UserError


class CLIError(UserError):
    """A user error: printed as one line, exit status 2, no traceback."""


def config_defaults_help(defaults: Callable[[], dict[str, str]]) -> type[argparse.HelpFormatter]:
    """A parser's `formatter_class` that appends "(default X)" to each option whose dest `defaults()` names.

    For options that stand for a config dataclass's fields: they default to `argparse.SUPPRESS`, so one not given
    leaves the dataclass's default in force (`given_fields`), and their help reads that default when help is
    printed. A changed default then reaches the command and its help with no copy to forget."""

    class ConfigDefaultsHelpFormatter(argparse.HelpFormatter):
        def _get_help_string(self, action):   # the hook argparse's own ArgumentDefaultsHelpFormatter overrides
            text = defaults().get(action.dest)
            return action.help if text is None else f"{action.help or ''} (default {text})".lstrip()

    return ConfigDefaultsHelpFormatter


def field_defaults(config_cls) -> dict[str, str]:
    """A config dataclass's field defaults as help text, for `config_defaults_help` (fields without a default, or
    defaulting to None or "", are left out: their help says what unset means)."""
    return {field.name: str(field.default) for field in dataclasses.fields(config_cls)
            if field.default is not dataclasses.MISSING and field.default not in (None, "")}


def given_fields(args: argparse.Namespace, config_cls) -> dict:
    """The fields of `config_cls` that the command line gave (options defaulting to `argparse.SUPPRESS`)."""
    return {field.name: getattr(args, field.name) for field in dataclasses.fields(config_cls)
            if hasattr(args, field.name)}
