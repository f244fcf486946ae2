"""The three registries other packages extend: benchmarks, methods and attacks.

Each is an entry-point group (Python's standard plugin mechanism, as pytest and lm-eval use):

    [project.entry-points."cru_harness.methods"]
    MyMethod = "my_package.my_method:METHOD"

The project's own built-ins register the same way, through its `pyproject.toml`, so a separate pip package adds
a benchmark, a method or an attack without editing this one (docs/extending.md). An entry point names an object
(a `cru_harness.api.Benchmark`, `Method` or `Attack` instance); it is imported the first time its registry is
read. `register()` adds one in-process (a notebook, a test). Names match after normalising case and whitespace
(`plugin_key`: "GA " is GA); a name that is not registered is an `UnknownPluginError` listing the registered ones.

A plugin that cannot be used (its import raises anything, it names the wrong kind of object, or its name is
another's) is kept aside with one line naming it and its distribution: only a command that needs that name fails
(`get`), the other names, `report` on existing results and the built-ins work as before.
A command plugin (group `cru_harness.commands`) names a function `add_parser(subparsers)` that adds one subcommand
of that entry point's name to `cru-harness` (`add_commands`): a benchmark's own command (TOFU's `score`) without the
core CLI naming it. Only those modules are imported to build the CLI, not every plugin; one that cannot be used is
kept aside the same way: its command answers with the one line, the other commands work as before.
A plugin's `known_as` are other names it answers to (open-unlearning's trainer names: `GradAscent` is GA): every
lookup turns them into the canonical name, so configs, results and cell hashes only ever hold that.

Foundation layer: imports nothing of the project but `errors`.
"""
from __future__ import annotations

import difflib
import re
from importlib.metadata import entry_points
from typing import Any, Iterator

from .errors import InputError, UserError, excerpt, one_line

GROUPS = {"benchmark": "cru_harness.benchmarks", "method": "cru_harness.methods", "attack": "cru_harness.attacks"}
#: Subcommands of `cru-harness` that packages add (`add_commands`): name -> "module:add_parser".
COMMANDS = "cru_harness.commands"


class UnknownPluginError(InputError):
    """A benchmark, method or attack name that no installed package registers."""


class PluginError(UserError, TypeError):
    """An installed plugin that cannot be used: its entry point fails to import, names the wrong kind of object,
    or takes a name another plugin has."""


def plugin_key(name: Any) -> str:
    """How plugin names are compared: case and whitespace do not tell two plugins apart."""
    return re.sub(r"\s+", "", str(name)).casefold()


def _distribution(ep) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"


def check_trained(value: Any, plugin: Any, kind: str) -> Any:
    """What a method's or attack's `run(ctx)` returned, if it keeps the contract: a `cru_harness.api.Trained` with
    a non-empty str `model_path` and `routers` None or a str. Otherwise a `PluginError` naming the plugin."""
    from .api import Trained

    name = getattr(plugin, "name", type(plugin).__name__)
    problem = None
    if not isinstance(value, Trained):
        problem = f"returned {excerpt(value, 80)} ({type(value).__name__})"
    elif not isinstance(value.model_path, str) or not value.model_path.strip():
        problem = f"returned Trained(model_path={excerpt(value.model_path, 80)})"
    elif value.routers is not None and not isinstance(value.routers, str):
        problem = f"returned Trained(routers={excerpt(value.routers, 80)})"
    if problem:
        raise PluginError(f"{kind} plugin {name!r} ({type(plugin).__module__}) breaks the run() contract: it "
                          f"{problem}; run(ctx) must return cru_harness.api.Trained(model_path=<a model directory "
                          "or Hub id>, routers=<a bundle directory, or None>)")
    return value


class Registry:
    """Name -> plugin object for one entry-point group, loaded lazily."""

    def __init__(self, kind: str, group: str, not_here: dict[str, str] | None = None):
        self.kind, self.group = kind, group
        self.not_here = not_here or {}   # a name users try that is something else: where to find it instead
        self._items: dict[str, Any] | None = None
        self._known_as: dict[str, str] = {}   # another name (lower case) -> the plugin's key
        self._added: dict[str, Any] = {}
        self._broken: dict[str, str] = {}   # normalised name -> why it cannot be used (one line)

    def _check(self, obj: Any, origin: str) -> str:
        from . import api

        expected = {"benchmark": api.Benchmark, "method": api.Method, "attack": api.Attack}[self.kind]
        if not isinstance(obj, expected):
            raise PluginError(f"{origin} is not a cru_harness.api.{expected.__name__} (got {type(obj).__name__}); "
                              f"a `{self.group}` entry point must name one")
        name = getattr(obj, "name", "")
        if not isinstance(name, str) or not name:
            raise PluginError(f"{origin}: a {self.kind} needs a non-empty `name`")
        return name

    def _load(self) -> dict[str, Any]:
        if self._items is not None:
            return self._items
        items: dict[str, Any] = {}
        origins: dict[str, str] = {}
        broken: dict[str, str] = {}
        for ep in entry_points(group=self.group):
            origin = f"{self.kind} plugin {ep.name!r} (entry point {ep.value!r} of {_distribution(ep)})"
            try:
                obj = ep.load()
                name = self._check(obj, origin)
            except PluginError as err:
                broken[plugin_key(ep.name)] = one_line(err)
                continue
            except Exception as err:  # noqa: BLE001 - any failure of someone else's import: named, kept aside
                broken[plugin_key(ep.name)] = (f"{origin} cannot be imported: {type(err).__name__}: "
                                               f"{excerpt(one_line(err), 300)}; fix or uninstall it")
                continue
            key = plugin_key(name)
            if key in items and items[key] is not obj:
                broken[key] = f"two {self.kind}s are named {name!r}: {origins[key]} and {origin}; uninstall one"
                continue
            items[key], origins[key] = obj, origin
        for key in broken:
            items.pop(key, None)   # a name two plugins claim is neither's
        items.update(self._added)
        self._broken = broken
        self._known_as = self._other_names(items)
        # listing order: a plugin's `order` (the built-ins: the order of the paper's tables), then its name
        self._items = dict(sorted(items.items(), key=lambda kv: (getattr(kv[1], "order", 100), kv[0])))
        return self._items

    def _other_names(self, items: dict[str, Any]) -> dict[str, str]:
        """`known_as` of every plugin -> its key. A plugin whose `known_as` is malformed, or names another plugin (its
        name, or one of its other names), is kept aside as unusable under its own name, like a broken plugin: one
        line naming both plugins. Two plugins claiming one other name are both kept aside, as two plugins of one
        name are; the plugin whose name was claimed stays usable."""
        claims: dict[str, list[str]] = {}   # another name (normalised) -> the keys of the plugins declaring it
        for key, obj in list(items.items()):
            names = getattr(obj, "known_as", ()) or ()
            if isinstance(names, str) or not all(isinstance(n, str) and n.strip() for n in names):
                self._broken[key] = f"{self.kind} {obj.name!r}: `known_as` must be a tuple of non-empty names"
                del items[key]
                continue
            for name in names:
                if plugin_key(name) != key and key not in claims.setdefault(plugin_key(name), []):
                    claims[plugin_key(name)].append(key)
        aside: dict[str, str] = {}
        for low, keys in claims.items():
            for key in keys:
                obj = items[key]
                name = next(n for n in obj.known_as if plugin_key(n) == low)
                if low in items:
                    aside.setdefault(key, f"{self.kind} {obj.name!r} is known as {name!r}, the name of {self.kind} "
                                          f"{items[low].name!r}: drop it from {obj.name!r}'s known_as, or uninstall one")
                for other in keys:
                    if other != key:
                        aside.setdefault(key, f"{self.kind} {obj.name!r} is known as {name!r}, as {self.kind} "
                                              f"{items[other].name!r} is: drop it from one's known_as, or uninstall one")
        for key, why in aside.items():
            self._broken[key] = why
            del items[key]
        return {low: keys[0] for low, keys in claims.items() if keys[0] not in aside}

    def _key(self, name: Any) -> str:
        """The registry key of a name or of one of a plugin's other names (unknown names come back normalised)."""
        low = plugin_key(name)
        items = self._load()
        return low if low in items else self._known_as.get(low, low)

    def register(self, obj: Any) -> Any:
        """Add a plugin object in this process (entry points are for installed packages). Returns `obj`."""
        key = plugin_key(self._check(obj, f"register({excerpt(obj, 80)})"))
        current = self._load().get(key)
        if current is not None and current is not obj:
            raise PluginError(f"a {self.kind} named {obj.name!r} is already registered")
        self._added[key] = obj
        self._items = None   # re-sorted on the next read
        self._load()         # its other names are checked now, not at the next lookup
        names = getattr(obj, "known_as", ()) or ()
        claimed = [self._broken[k] for k in [key, *(plugin_key(n) for n in names if isinstance(n, str))]
                   if k in self._broken]
        if claimed:          # a plugin added in-process is refused outright (an installed one is kept aside)
            del self._added[key]
            self._items = None
            self._load()
            raise PluginError(claimed[0])
        return obj

    def unregister(self, name: str) -> None:
        """Remove a plugin added with `register` (tests)."""
        key = plugin_key(name)
        if key in self._added:
            del self._added[key]
            self._items = None

    def canonical(self, name: Any) -> str | None:
        """The registered spelling of `name` (`npo` -> `NPO`, `GradAscent` -> `GA`), or None; a `PluginError` when
        the plugin installed under that name cannot be used (a config naming it stops, in one line naming it)."""
        obj = self._load().get(self._key(name))
        if obj is None and plugin_key(name) in self._broken:
            raise PluginError(self._broken[plugin_key(name)])
        return None if obj is None else obj.name

    def get(self, name: Any) -> Any:
        obj = self._load().get(self._key(name))
        if obj is None:
            if (why := self._broken.get(plugin_key(name))):
                raise PluginError(why)
            shown = excerpt(name if isinstance(name, str) else str(name), 80)
            if (elsewhere := self.not_here.get(str(name).lower())):
                raise UnknownPluginError(f"{shown} is not a registered {self.kind}: {elsewhere}")
            names = self.names()
            close = difflib.get_close_matches(str(name)[:200], names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            unusable = (f"; not usable: {'; '.join(self._broken.values())[:600]}" if self._broken else "")
            raise UnknownPluginError(f"unknown {self.kind} {shown}{hint}; registered: {', '.join(names) or 'none'}"
                                     f"{unusable}")
        return obj

    def broken(self) -> dict[str, str]:
        """Installed plugins that cannot be used: normalised name -> why (one line)."""
        self._load()
        return dict(self._broken)

    def names(self) -> list[str]:
        return [obj.name for obj in self._load().values()]

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._load().values()))

    def known_as(self) -> dict[str, str]:
        """Every other name a plugin answers to -> its canonical name (`GradAscent` -> `GA`)."""
        items = self._load()
        return {next(n for n in items[key].known_as if plugin_key(n) == low): items[key].name
                for low, key in self._known_as.items()}

    def __contains__(self, name: Any) -> bool:
        return self._key(name) in self._load()


benchmarks = Registry("benchmark", GROUPS["benchmark"])
methods = Registry("method", GROUPS["method"])
attacks = Registry("attack", GROUPS["attack"], not_here={
    name: "the logit lens reads a model and changes nothing, so it is a metric: set `evaluation.logit_lens: true` in "
          "a run's config, or run `cru-harness lens --model DIR --data forget10` on one model"
    for name in ("logit_lens", "logit-lens", "lens")})


def add_commands(subparsers) -> dict[str, str]:
    """Adds each `cru_harness.commands` entry point's subcommand: its `add_parser(subparsers)` must add a subcommand
    of the entry point's name. One that cannot be used (its import or its `add_parser` raises, it adds no command of
    that name, or the name is already a command) is kept aside: its name, where free, answers every call with one
    line naming the entry point and its distribution (a `PluginError`). Returns name -> why, for those kept aside."""
    broken: dict[str, str] = {}
    for ep in sorted(entry_points(group=COMMANDS), key=lambda ep: ep.name):
        origin = f"command plugin {ep.name!r} (entry point {ep.value!r} of {_distribution(ep)})"
        if ep.name in subparsers.choices:
            broken[ep.name] = f"{origin}: `{ep.name}` is already a cru-harness command; uninstall one"
            continue
        try:
            add_parser = ep.load()
            if not callable(add_parser):
                raise PluginError(f"{origin} is not a function add_parser(subparsers) (got "
                                  f"{type(add_parser).__name__})")
            add_parser(subparsers)
            if ep.name not in subparsers.choices:
                raise PluginError(f"{origin}: its add_parser(subparsers) added no `{ep.name}` command")
        except PluginError as err:
            broken[ep.name] = one_line(err)
        except Exception as err:  # noqa: BLE001 - any failure of someone else's code: named, kept aside
            broken[ep.name] = (f"{origin} cannot be used: {type(err).__name__}: {excerpt(one_line(err), 300)}; "
                               "fix or uninstall it")
        else:
            continue
        _set_aside(subparsers, ep.name, broken[ep.name])
    return broken


def _set_aside(subparsers, name: str, why: str) -> None:
    """`name` as a command that takes any arguments and raises `PluginError(why)` (argparse never reads them: no
    character starts an option)."""
    def refuse(args):
        raise PluginError(why)

    parser = subparsers.choices.get(name)
    if parser is None:
        parser = subparsers.add_parser(name, help="(cannot be used: run it for why)", add_help=False,
                                       prefix_chars="\x00")
        parser.add_argument("arguments", nargs="*")
    parser.set_defaults(func=refuse)
