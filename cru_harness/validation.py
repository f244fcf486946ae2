"""Checks of a YAML settings file (a runner config, a study, a report block), each failure a `ConfigError` naming
the offending key as a path (`methods[2].lr`), so a typo never silently becomes a default. Foundation layer:
stdlib and the hyperparameter rules only; `runner.config` validates experiment configs with these, plugins'
`resolve_block` receive them bound to a file as a `ConfigChecker`."""
from __future__ import annotations

from typing import Any

from .errors import UserError, excerpt  # noqa: F401  (excerpt: importable here)
from .hparams import bound_problem


#: The longest `ConfigError` message; a longer one keeps its start and end (where the key and the advice are).
MAX_MESSAGE = 1000


def bound_message(message: str, limit: int = MAX_MESSAGE) -> str:
    if len(message) <= limit:
        return message
    keep = limit // 2
    return f"{message[:keep]} ...({len(message) - 2 * keep:,} characters left out)... {message[-keep:]}"


class ConfigError(UserError, ValueError):
    """An invalid experiment config. `key` is the path of the offending key, e.g. `methods[2].lr`. The message is
    bounded (`bound_message`): a value echoed whole would make an error line as long as the config allows."""

    def __init__(self, key: str, message: str, source: str | None = None):
        self.key = key
        where = f"{source}: " if source else ""
        what = f"{key}: " if key else ""   # "" is the config as a whole
        super().__init__(bound_message(f"{where}{what}{message}"))


def _fail(key: str, message: str, source: str | None):
    raise ConfigError(key, message, source)


class ConfigChecker:
    """The config checks a plugin's `resolve_block` may use, bound to the config file they report: every failure is
    a `ConfigError` naming the key."""

    def __init__(self, source: str | None):
        self.source = source

    def fail(self, key: str, message: str):
        _fail(key, message, self.source)

    def keys(self, mapping: Any, allowed: tuple[str, ...], where: str) -> dict:
        return _check_keys(mapping, allowed, where, self.source)

    def number(self, value: Any, key: str, **rule):
        return _number(value, key, self.source, **rule)

    def str_list(self, value: Any, key: str) -> list[str]:
        return _str_list(value, key, self.source)

    def boolean(self, value: Any, key: str, *, allow_none: bool = False):
        return _boolean(value, key, self.source, allow_none=allow_none)


def _check_keys(mapping: Any, allowed: tuple[str, ...], where: str, source: str | None) -> dict:
    if not isinstance(mapping, dict):
        _fail(where, f"expected a mapping, got {type(mapping).__name__}", source)
    for key in mapping:
        if key not in allowed:
            path = f"{where}.{key}" if where else str(key)
            hint = _suggest(str(key), allowed)
            _fail(path, f"unknown key{hint}; allowed here: {', '.join(allowed)}", source)
    return mapping


def _suggest(key: str, allowed) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(allowed), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _str_list(value: Any, key: str, source: str | None) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        _fail(key, f"expected a string or a list of strings, got {value!r}", source)
    return list(value)


def _boolean(value: Any, key: str, source: str | None, *, allow_none: bool = False) -> bool | None:
    """A YAML boolean, nothing else: `"false"` (a string) or 0 must never read as a setting (`bool("false")` is
    True, which would turn trust_remote_code on)."""
    if isinstance(value, bool) or (allow_none and value is None):
        return value
    expected = "true, false or null" if allow_none else "true or false"
    _fail(key, f"expected {expected} (a YAML boolean, unquoted), got {value!r}", source)


def _number(value: Any, key: str, source: str | None, **rule):
    """A number under `rule` (see `bound_problem`), or a ConfigError at `key`."""
    # YAML reads 1e-5 (no dot) as a string: accept numeric strings.
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            _fail(key, f"expected a number, got {value!r}", source)
    if rule.get("integer") and isinstance(value, float) and value.is_integer():
        value = int(value)
    problem = bound_problem(value, **rule)
    if problem:
        _fail(key, problem, source)
    return value
