"""On-disk results: `<output_dir>/cells/<hash>/{result.json, run_record.json}`, written atomically.

A cell is finished when its `result.json` exists with status "ok". Files are written to a temporary file in
the same directory and moved into place with `os.replace`, so a killed process leaves either the old file or
the new one, never half a file. `run_record.json` is written before `result.json`, so a result never lacks
its record. A cell directory without a result (killed mid-way) is recomputed from scratch on resume.
"""
from __future__ import annotations

import json
import math
import os
import platform
import shutil
import socket
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

RESULT_FILE = "result.json"
RECORD_FILE = "run_record.json"
RUNNING_FILE = "RUNNING"
WORK_DIR = "work"
CELLS_DIR = "cells"
FINISHED_STATUSES = ("ok",)
_LIBRARIES = ("torch", "transformers", "lm_eval", "accelerate", "datasets", "huggingface_hub", "numpy", "scipy",
              "tokenizers", "safetensors", "rouge_score", "cru_harness")


def _jsonable(value: Any) -> Any:
    """JSON-safe copy: NaN/inf become null (strict JSON), paths and numpy scalars become plain values."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if hasattr(value, "item"):  # numpy / torch scalars
        return _jsonable(value.item())
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    return str(value)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(_jsonable(obj), indent=2, sort_keys=False, allow_nan=False) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def library_versions() -> dict[str, str | None]:
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for name in _LIBRARIES:
        dist = {"lm_eval": "lm-eval", "cru_harness": "cru-harness", "rouge_score": "rouge-score"}.get(name, name)
        try:
            versions[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def environment_record() -> dict[str, Any]:
    """Where and by what a cell was computed: `code_version` (content hash of the package's source) and the git
    commit beside it, with `dirty` when the package's files differ from that commit (never commit such cells),
    library versions, host, and torch's thread count and CPU instruction set when torch is loaded."""
    from .provenance import code_record

    record = {**code_record(), "libraries": library_versions(), "host": socket.gethostname(),
              "platform": platform.platform(), "python_executable": sys.executable, "pid": os.getpid()}
    torch = sys.modules.get("torch")
    if torch is not None:
        record["torch_threads"] = torch.get_num_threads()
        record["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return record


class CellStore:
    """The cells of one run directory."""

    def __init__(self, output_dir: str | os.PathLike):
        self.root = Path(output_dir)
        self.cells_dir = self.root / CELLS_DIR

    def cell_dir(self, cell_hash: str) -> Path:
        return self.cells_dir / cell_hash

    def work_dir(self, cell_hash: str, fresh: bool = False) -> Path:
        work = self.cell_dir(cell_hash) / WORK_DIR
        if fresh and work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True, exist_ok=True)
        return work

    def load_result(self, cell_hash: str) -> dict | None:
        path = self.cell_dir(cell_hash) / RESULT_FILE
        if not path.is_file():
            return None
        try:
            return read_json(path)
        except (OSError, json.JSONDecodeError):
            return None  # unreadable = not finished (cannot happen with atomic writes, but be safe)

    def load_record(self, cell_hash: str) -> dict | None:
        """The cell's run record (what computed it), or None."""
        path = self.cell_dir(cell_hash) / RECORD_FILE
        try:
            return read_json(path) if path.is_file() else None
        except (OSError, json.JSONDecodeError):
            return None

    def is_finished(self, cell_hash: str) -> bool:
        result = self.load_result(cell_hash)
        return bool(result) and result.get("status") in FINISHED_STATUSES

    def was_interrupted(self, cell_hash: str) -> bool:
        """Started (RUNNING marker or work dir present) but without a result: killed mid-way."""
        cdir = self.cell_dir(cell_hash)
        return cdir.is_dir() and not (cdir / RESULT_FILE).is_file() and (
            (cdir / RUNNING_FILE).exists() or (cdir / WORK_DIR).exists())

    def mark_running(self, cell_hash: str) -> None:
        atomic_write_json(self.cell_dir(cell_hash) / RUNNING_FILE, {"pid": os.getpid(), "started": now_iso(),
                                                                   "host": socket.gethostname()})

    def write(self, cell_hash: str, result: dict, record: dict) -> None:
        cdir = self.cell_dir(cell_hash)
        atomic_write_json(cdir / RECORD_FILE, record)
        atomic_write_json(cdir / RESULT_FILE, result)
        running = cdir / RUNNING_FILE
        if running.exists():
            running.unlink()

    def iter_results(self) -> Iterator[tuple[str, dict]]:
        if not self.cells_dir.is_dir():
            return
        for cdir in sorted(self.cells_dir.iterdir()):
            result = self.load_result(cdir.name) if cdir.is_dir() else None
            if result is not None:
                yield cdir.name, result


def load_results(*dirs: str | os.PathLike) -> list[dict]:
    """Results of one or more run directories (or a `cells/` dir), deduplicated by hash: "ok" wins."""
    by_hash: dict[str, dict] = {}
    for directory in dirs:
        directory = Path(directory)
        if not directory.is_dir():
            raise FileNotFoundError(f"results directory not found: {directory}")
        root = directory.parent if directory.name == CELLS_DIR else directory
        store = CellStore(root)
        if not store.cells_dir.is_dir():
            raise FileNotFoundError(f"{directory} holds no `{CELLS_DIR}/` directory (not a cru-harness run)")
        for cell_hash, result in store.iter_results():
            result = dict(result, hash=result.get("hash", cell_hash))
            previous = by_hash.get(cell_hash)
            if previous is None or (previous.get("status") != "ok" and result.get("status") == "ok"):
                by_hash[cell_hash] = result
    return list(by_hash.values())
