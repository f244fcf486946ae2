"""Where benchmark data comes from: the Hugging Face Hub by default, a local directory when one is given."""
from __future__ import annotations

import functools

import json
import os
from pathlib import Path
from typing import Literal

from cru_harness.errors import UserError

from ..errors import InputError

Benchmark = Literal["tofu", "rwku"]

ENV_DATA_DIR = "CRU_HARNESS_DATA_DIR"  # a root holding tofu/ and rwku/
ENV_BENCHMARK_DIR = {"tofu": "CRU_HARNESS_TOFU_DIR", "rwku": "CRU_HARNESS_RWKU_DIR"}
HUB_IDS = {"tofu": "locuslab/TOFU", "rwku": "jinzhuoran/RWKU"}

# A file that tells the two benchmark layouts apart, so a root and a benchmark folder can both be given.
_MARKERS = {"tofu": "forget10_perturbed.json", "rwku": "Target"}


class DataSourceError(UserError, RuntimeError):
    """The data cannot be read: no local copy was given and the Hub did not answer (or a file is unreadable)."""


def hub_unreachable(benchmark: Benchmark, what: str, cause: BaseException, repo: str | None = None
                    ) -> DataSourceError:
    return DataSourceError(
        f"could not load {what} from the Hugging Face Hub ({repo or HUB_IDS[benchmark]}): {cause}. "
        f"If the Hub is unreachable, point cru-harness at a local copy: set {ENV_BENCHMARK_DIR[benchmark]} "
        f"to the {benchmark} folder (or {ENV_DATA_DIR} to a folder holding tofu/ and rwku/), or pass "
        f"data_dir=... (lm-eval: --metadata '{{\"data_dir\": \"...\"}}'; cru-harness: --data-dir)."
    )


def hub_unreachable_now(benchmark: Benchmark, what: str, repo: str | None = None) -> DataSourceError | None:
    """The error to raise at once when the Hub cannot answer: no network to it (one connection attempt of a few
    seconds, made once per process) rather than the Hub client's retries (about 40 s). None when it may answer, or
    in offline mode (HF_HUB_OFFLINE), where the Hub client reads its cache and fails by itself without retrying."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return None
    cause = _hub_connection_problem()
    if cause is None:
        return None
    return hub_unreachable(benchmark, what, RuntimeError(f"{cause}; with a cached copy, set HF_HUB_OFFLINE=1"),
                           repo)


@functools.lru_cache(maxsize=1)
def _hub_connection_problem() -> str | None:
    import socket
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as err:
        return f"no connection to {host}:{port} ({err})"
    return None


def resolve_local_dir(benchmark: Benchmark, data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local folder of `benchmark`, or None when data should come from the Hub.

    Order: explicit `data_dir` (the benchmark folder itself, a root holding `tofu/` and `rwku/`, or
    `testbed:world`), then `CRU_HARNESS_TOFU_DIR` / `CRU_HARNESS_RWKU_DIR`, then `CRU_HARNESS_DATA_DIR` (a root).
    A directory that is given but does not hold the benchmark is an error, never a silent fall-back to the Hub.
    """
    if benchmark not in _MARKERS:
        raise InputError(f"unknown benchmark {benchmark!r}; expected one of {sorted(_MARKERS)}")
    candidates: list[tuple[str, str]] = []
    if data_dir:
        candidates.append(("data_dir", str(data_dir)))
    elif os.environ.get(ENV_BENCHMARK_DIR[benchmark]):
        candidates.append((ENV_BENCHMARK_DIR[benchmark], os.environ[ENV_BENCHMARK_DIR[benchmark]]))
    elif os.environ.get(ENV_DATA_DIR):
        candidates.append((ENV_DATA_DIR, os.environ[ENV_DATA_DIR]))
    for origin, raw in candidates:
        path = Path(named_data_dir(raw)).expanduser()
        if not path.is_dir():
            raise DataSourceError(f"{origin}={raw} is not a directory")
        for folder in (path, path / benchmark):
            if (folder / _MARKERS[benchmark]).exists():
                return folder
        raise DataSourceError(
            f"{origin}={raw} holds no {benchmark} data: expected {_MARKERS[benchmark]} in it or in {benchmark}/ below it"
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
