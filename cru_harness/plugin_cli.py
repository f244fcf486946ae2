"""`cru-harness methods | benchmarks | attacks`: what the registries hold (the built-ins and every installed
plugin), one row each."""
from __future__ import annotations

import argparse
import sys


def _methods_rows() -> list[list[str]]:
    from . import plugins

    benches = plugins.benchmarks.names()
    rows = []
    for m in plugins.methods:
        runs_on = [b for b in benches if m.unsupported(b) is None]
        kind = "adapter" if m.adapter else ("weights" if m.trains else "no training")
        rows.append([m.name, kind, "yes" if m.seeded else "no", ", ".join(runs_on),
                     "; ".join(m.needs) or "-", m.summary])
    return rows


def _benchmarks_rows() -> list[list[str]]:
    from . import plugins

    return [[b.name, b.unit, ", ".join(b.default_tasks), b.summary] for b in plugins.benchmarks]


def _attacks_rows() -> list[list[str]]:
    from . import plugins

    return [[a.name, ", ".join(a.settings()) or "-", a.summary] for a in plugins.attacks]


LISTINGS = {
    "methods": (["method", "trains", "seeded", "benchmarks", "needs", "what it does"], _methods_rows,
                "list the registered unlearning methods and what each needs"),
    "benchmarks": (["benchmark", "unit", "default tasks", "what it is"], _benchmarks_rows,
                   "list the registered benchmarks"),
    "attacks": (["attack", "settings", "what it does"], _attacks_rows, "list the registered attacks"),
}


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """A plain-text table, columns padded to their widest cell (the last column is left unpadded)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for row in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths)] + [str(row[-1])]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def run_listing(args: argparse.Namespace) -> int:
    header, rows, _ = LISTINGS[args.command]
    print(format_table(header, rows()))
    from . import plugins

    registry = {"methods": plugins.methods, "benchmarks": plugins.benchmarks, "attacks": plugins.attacks}.get(
        args.command)
    for why in (registry.broken().values() if registry is not None else ()):
        print(f"not usable: {why}", file=sys.stderr)   # installed but broken: named, the rest listed as usual
    return 0


def register(subparsers) -> None:
    for name, (_, _, help_text) in LISTINGS.items():
        parser = subparsers.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] +
                                       " (the built-ins and every installed plugin: docs/extending.md).")
        parser.set_defaults(func=run_listing)
