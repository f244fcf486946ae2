"""Lazy package exports (PEP 562), so importing a package for its registry (`cru-harness methods`) does not import
the training libraries its other names need. Foundation layer: imports nothing of the project."""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, namespace: dict[str, Any], exports: dict[str, str], *,
                 submodules: bool = False) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` serving each name of `exports` (name -> module, relative to `package`)
    on first use, then bound in `namespace` (the package's globals). `submodules`: another name is tried as a
    submodule, as an eager `__init__` that imported them all had bound it."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            if submodules:
                try:
                    return importlib.import_module(f".{name}", package)
                except ModuleNotFoundError:
                    pass
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        namespace[name] = value
        return value

    return __getattr__
