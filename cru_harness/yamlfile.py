"""Reading a YAML config the user wrote, bounded: what validation walks and what an error echoes stays small.

PyYAML's `safe_load` runs no code, but a few lines of aliases (`a: &a [x, x]`, `b: &b [*a, *a]`, ...) stand for
billions of values once expanded, and validation walks, copies and prints the expanded value; its composer also
recurses once per nesting level, so a deeply nested file ends in a RecursionError. `read_yaml` therefore refuses,
before anything is validated, each with one line naming the file:

- a file larger than `MAX_BYTES`, or not UTF-8 (the byte offset is named);
- nesting deeper than `MAX_DEPTH`, counted while composing (no recursion limit is met);
- a document whose value, aliases expanded, holds more than `MAX_NODES` values or nests deeper than
  `MAX_DEPTH` (anchors and aliases stay usable for what they are for: sharing a setting between a few
  entries), or an alias of a value that contains it;
- a mapping that gives one key twice (PyYAML keeps the last silently: `trust_remote_code: false` then `true`
  read as true), named with both lines.

The one YAML loader of the project (foundation layer): runner configs (`runner.config.load_config`), study
configs (`studies.config`) and the `--set KEY=VALUE` values of `unlearn` and `attack` (`load_value`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

#: Largest config file read; the project's own are under 10 kB.
MAX_BYTES = 1 << 20
#: Deepest nesting of mappings and sequences; the project's configs nest 5 deep.
MAX_DEPTH = 50
#: Most values (mappings, sequences and scalars, each alias counted as the value it stands for) in a document.
MAX_NODES = 100_000


class _LimitError(Exception):
    """Raised by the loader; `read_yaml` turns it into a `ConfigError` naming the file."""


class BoundedSafeLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` whose composer counts nesting (`MAX_DEPTH`) and, per document, the values its aliases
    expand to (`MAX_NODES`) before any Python object is built."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _LimitError(f"nested more than {MAX_DEPTH} levels deep (line {mark.line + 1}); a config "
                                  "nests a few levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        expanded_size(node)
        return node

    def construct_mapping(self, node, deep=False):
        """A key given twice in one mapping is an error naming it and both lines (merge keys `<<` aside: a key
        written beside a merge overrides it, as YAML means)."""
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                try:
                    key = self.construct_object(key_node, deep=True)
                    hash(key)
                except (TypeError, yaml.YAMLError):
                    continue
                line = key_node.start_mark.line + 1
                if key in seen:
                    from .errors import excerpt

                    raise _LimitError(f"key {excerpt(key, 80)} is given twice in one mapping (lines {seen[key]} and "
                                      f"{line}): PyYAML would keep the last silently; say it once")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def expanded_size(root: yaml.Node) -> int:
    """The number of values `root` stands for with every alias expanded (shared nodes counted once per use);
    `_LimitError` past `MAX_NODES` or on an alias of itself. Iterative: the depth of the expansion is not
    bounded by the nesting of the text."""
    sizes: dict[int, int] = {}
    depths: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = _children(node)
        if children_done:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in children)
            depths[key] = 1 + max((depths[id(child)] for child in children), default=0)
            if depths[key] > MAX_DEPTH:   # aliases nested in aliases: deeper than the text
                raise _LimitError(f"the value at line {node.start_mark.line + 1} is nested more than {MAX_DEPTH} "
                                  "levels deep once its aliases (*name) are expanded")
            if sizes[key] > MAX_NODES:
                mark = node.start_mark
                raise _LimitError(f"the value at line {mark.line + 1} stands for more than {MAX_NODES:,} values "
                                  "once its aliases (*name) are expanded; write the values out, or alias fewer")
            continue
        if key in open_nodes:
            raise _LimitError(f"the alias at line {node.start_mark.line + 1} refers to a value that contains it")
        open_nodes.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in open_nodes:
                raise _LimitError(f"an alias at line {child.start_mark.line + 1} refers to a value that contains "
                                  "it (a recursive alias)")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load_value(text: str, what: str) -> Any:
    """A YAML value the user typed on the command line (`--set KEY=VALUE`), read by the same loader; an
    `InputError` naming `what` when it is not YAML or says something twice."""
    from .errors import InputError, excerpt

    try:
        return yaml.load(text, Loader=BoundedSafeLoader)  # noqa: S506 - a SafeLoader (constructs plain data only)
    except _LimitError as err:
        raise InputError(f"{what}: {err}") from None
    except yaml.YAMLError as err:
        problem = " ".join(str(err).split())[:200]
        raise InputError(f"{what}: {excerpt(text, 80)} is not a YAML value ({problem})") from None


def read_yaml(path: str | os.PathLike, source: str | None = None) -> Any:
    """The parsed YAML file `path`, bounded as the module doc says; a `ConfigError` (key `<file>`) naming
    `source` (default: the path) otherwise."""
    from .validation import ConfigError

    path = Path(path)
    source = source or str(path)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ConfigError("<file>", f"{size:,} bytes is more than a config may hold ({MAX_BYTES:,})", source)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError("<file>", f"not UTF-8 text (byte {err.start}: {data[err.start:err.start + 1]!r}); save "
                          "it as UTF-8", source) from None
    try:
        return yaml.load(text, Loader=BoundedSafeLoader)  # noqa: S506 - a SafeLoader (constructs plain data only)
    except _LimitError as err:
        raise ConfigError("<file>", str(err), source) from None
    except yaml.YAMLError as err:
        raise ConfigError("<file>", f"not valid YAML: {err}", source) from err
