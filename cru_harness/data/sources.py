"""Where benchmark data comes from: the Hugging Face Hub by default, a local directory when one is given."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Union

from cru_harness.api import DataSource
from cru_harness.errors import UserError

from ..errors import InputError

#: A benchmark as `resolve_local_dir` takes it: its `DataSource`, its plugin (`api.Benchmark`) or registered name.
BenchmarkData = Union[DataSource, Any, str]

ENV_DATA_DIR = "CRU_HARNESS_DATA_DIR"  # a root holding one folder per benchmark (`DataSource.folder`)


class DataSourceError(UserError, RuntimeError):
    """The data cannot be read: no local copy was given and the Hub did not answer (or a file is unreadable)."""


def data_source(benchmark: BenchmarkData) -> DataSource:
    """The `DataSource` of a benchmark given as one, as its plugin, or by its registered name (the plugin's `data`
    hook; a name no plugin has, or a plugin without data of its own, is an `InputError`)."""
    if isinstance(benchmark, DataSource):
        return benchmark
    from .. import plugins

    plugin = plugins.benchmarks.get(benchmark) if isinstance(benchmark, str) else benchmark
    if getattr(plugin, "data", None) is None:
        raise InputError(f"benchmark {plugin.name!r} reads no data folder of its own")
    return plugin.data


def local_copy_hint(source: DataSource) -> str:
    """How to point cru-harness at a local copy of `source`'s data (every data error names it)."""
    env = f"set {source.env_var} to the {source.folder} folder (or {ENV_DATA_DIR}" if source.env_var else \
        f"set {ENV_DATA_DIR}"
    close = ")" if source.env_var else ""
    return (f"{env} to a folder holding {source.folder}/ beside the other benchmarks' folders{close}, or pass "
            f"data_dir=... (lm-eval: --metadata '{{\"data_dir\": \"...\"}}'; cru-harness: --data-dir)")


def hub_unreachable(benchmark: BenchmarkData, what: str, cause: BaseException, repo: str | None = None
                    ) -> DataSourceError:
    source = data_source(benchmark)
    return DataSourceError(
        f"could not load {what} from the Hugging Face Hub ({repo or source.hub_id}): {cause}. "
        f"If the Hub is unreachable, point cru-harness at a local copy: {local_copy_hint(source)}."
    )


def resolve_local_dir(benchmark: BenchmarkData, data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local folder of `benchmark` (its `DataSource`, plugin or name), or None when data should come from the Hub.

    Order: explicit `data_dir` (the benchmark folder itself, a root holding its folder, or a named directory such
    as `testbed:world`), then its own environment variable (`DataSource.env_var`), then `CRU_HARNESS_DATA_DIR` (a
    root). A folder is the benchmark's when its `DataSource.marker` is at its top. A directory that is given but
    does not hold the benchmark is an error, never a silent fall-back to the Hub.
    """
    source = data_source(benchmark)
    candidates: list[tuple[str, str]] = []
    if data_dir:
        candidates.append(("data_dir", str(data_dir)))
    elif source.env_var and os.environ.get(source.env_var):
        candidates.append((source.env_var, os.environ[source.env_var]))
    elif os.environ.get(ENV_DATA_DIR):
        candidates.append((ENV_DATA_DIR, os.environ[ENV_DATA_DIR]))
    for origin, raw in candidates:
        path = Path(named_data_dir(raw)).expanduser()
        if not path.is_dir():
            raise DataSourceError(f"{origin}={raw} is not a directory")
        for folder in (path, path / source.folder):
            if (folder / source.marker).exists():
                return folder
        raise DataSourceError(
            f"{origin}={raw} holds no {source.folder} data: expected {source.marker} in it or in {source.folder}/ "
            "below it"
        )
    return None


#: Data directories known by name: name -> "module:function" that builds (once, cached) and returns it. The testbed
#: builds on this package, so its world is named by path and imported only when the name is used.
NAMED_DATA_DIRS = {"testbed:world": "cru_harness.testbed.zoo:tiny_world_dir"}


def named_data_dir(data_dir: str) -> str:
    """A named data directory (`testbed:world`) resolved to its path; any other value as given."""
    if data_dir not in NAMED_DATA_DIRS:
        return data_dir
    import importlib

    module, _, function = NAMED_DATA_DIRS[data_dir].partition(":")
    return str(getattr(importlib.import_module(module), function)())


def read_json_records(path: Path) -> list[dict]:
    """Rows of a JSON array file or a JSON-lines file, with a clear error for a missing or corrupt file."""
    if not path.is_file():
        raise DataSourceError(f"data file not found: {path}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataSourceError(f"{path} is not UTF-8 text (byte {err.start}: {data[err.start:err.start + 1]!r}); "
                              "save it as UTF-8") from None
    stripped = text.lstrip()
    try:
        if stripped.startswith("["):
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise DataSourceError(f"{path} is not valid JSON or JSON lines: {err}") from err
    if not all(isinstance(row, dict) for row in rows):
        raise DataSourceError(f"{path}: every row must be a JSON object")
    return rows
