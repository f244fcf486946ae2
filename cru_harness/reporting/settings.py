"""The settings a report reads back from a run: its `report:` block and the method entries of its plan, checked
as the runner checked them (the runner validates a config's `report:` with `report_settings` too)."""
from __future__ import annotations

from typing import Any

from .. import plugins
from ..validation import _boolean, _check_keys, _fail, _str_list

_REPORT_KEYS = ("formats", "plots", "stats")
_REPORT_FORMATS = ("md", "csv", "tex")


def report_settings(raw_report: Any, source: str | None = None) -> dict[str, Any]:
    """A config's `report:` block, checked, with its defaults (every format, plots, statistics): what `cru-harness
    run` writes its report with, and what `cru-harness report` reads back from a run's plan.json."""
    report = _check_keys(raw_report or {}, _REPORT_KEYS, "report", source)
    report = {"formats": list(_REPORT_FORMATS), "plots": True, "stats": True, **report}
    formats = _str_list(report["formats"], "report.formats", source)
    for i, fmt in enumerate(formats):
        if fmt not in _REPORT_FORMATS:
            _fail(f"report.formats[{i}]", f"expected one of {', '.join(_REPORT_FORMATS)}, got {fmt!r}", source)
    report["formats"] = formats
    for key in ("plots", "stats"):
        _boolean(report[key], f"report.{key}", source)
    return report


def configured_methods(raw: dict) -> list[dict]:
    """Each `methods` entry of a raw config (a plan.json's, as the run read it) as validation reads it: `label`
    (the method's canonical name unless given), `method` (canonical, None if unknown), `benchmarks` (a list: the
    entry's own, a single name or several, else `default_benchmarks`) and `explicit` (whether the entry names
    them). For readers of finished runs (the report); `validate_config` checks the entries themselves."""
    configured = list((raw.get("benchmarks") or {}))
    entries = []
    for entry in raw.get("methods") or []:
        entry = {"method": entry} if isinstance(entry, str) else (entry if isinstance(entry, dict) else {})
        method = plugins.methods.canonical(entry.get("method"))
        given = entry.get("benchmarks")
        benches = [given] if isinstance(given, str) else list(given) if given else (
            [b for b in configured if plugins.methods.get(method).unsupported(b) is None] if method else [])
        entries.append({"label": entry.get("label", method), "method": method, "benchmarks": benches,
                        "explicit": given is not None})
    return entries
