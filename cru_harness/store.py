"""On-disk results: `<output_dir>/cells/<hash>/{result.json, run_record.json}`, written atomically.

A cell is finished when its `result.json` is a valid result (`validate_result`: schema version, the fields
readers use, its own hash, the digest of its content, every metric in its range) with status "ok", and its
`run_record.json` is valid too. An invalid file is reported
by path and its cell recomputed, never counted as done. Files are written to a temporary file in the same
directory and moved into place with `os.replace`, so a killed process leaves either the old file or the new
one, never half a file. `run_record.json` is written before `result.json`, so a result never lacks its record.
A cell directory without a result (killed mid-way) is recomputed from scratch on resume.

One run at a time per output directory: `RunLock` (an `flock` on `<output_dir>/.lock`, holding the owner's
pid, host and start time). A shard holds the directory lock shared plus its own shard lock, so the shards of
one run can share a directory while a second full run (or the same shard twice) is refused.
"""
from __future__ import annotations

import json
import math
import os
import platform
import secrets
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import WRITE_ERRNOS, InputError, MissingInputError, OutputWriteError, UserError, excerpt
from .locations import describe_holder, file_lock

RESULT_FILE = "result.json"
RECORD_FILE = "run_record.json"
RUNNING_FILE = "RUNNING"
#: A good result (and its record) kept aside while its cell is recomputed: `previous.result.json`.
PREVIOUS_PREFIX = "previous."
WORK_DIR = "work"
CELLS_DIR = "cells"
LOCK_FILE = ".lock"
FINISHED_STATUSES = ("ok",)
STATUSES = ("ok", "failed", "unavailable")
RESULT_SCHEMA_VERSION = 1   # bump when result.json changes meaning; older files are then recomputed
RECORD_SCHEMA_VERSION = 1
# Fields every reader (resume, report, merge, Forget Quality) relies on, with their types.
_RESULT_FIELDS = {"hash": str, "status": str, "kind": str, "label": str, "model": str, "benchmark": str,
                  "metrics": dict}
_OPTIONAL_RESULT_FIELDS = {"per_item": dict, "resources": dict, "details": dict, "artifacts": dict,
                           "failure_classes": dict, "hparams": dict, "gate_means": (dict, type(None))}
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
    """Write `path` whole or not at all: a temporary file beside it (`.NAME.RANDOM.tmp`), then a rename. The file
    gets the permissions the umask gives (mkstemp's 0600 would keep results from the rest of a shared group)."""
    path, tmp = Path(path), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while tmp is None:
            tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                tmp = None
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.errno in WRITE_ERRNOS:   # the machine's, not a bug: one line
            raise OutputWriteError(f"cannot write {path}: {err.strerror} (what was written before it is "
                                   "kept whole)") from err
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(_jsonable(obj), indent=2, sort_keys=False, allow_nan=False) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_recorded_json(path: str | os.PathLike, what: str) -> Any:
    """A JSON file a run wrote that a command relies on (`what`: its plan, an RWKU target choice). One that
    cannot be read or parsed is an `InputError` naming it, in one line: never a traceback, never read as absent."""
    try:
        return read_json(path)
    except (OSError, ValueError) as err:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise InputError(f"{path}: cannot read {what} ({err})") from None


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
    from .fingerprints import code_record

    record = {**code_record(), "libraries": library_versions(), "host": socket.gethostname(),
              "platform": platform.platform(), "python_executable": sys.executable, "pid": os.getpid()}
    torch = sys.modules.get("torch")
    if torch is not None:
        record["torch_threads"] = torch.get_num_threads()
        record["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return record


# ----------------------------------------------------------------------------------------- content checks
DIGEST_FIELD = "digest"
DIGEST_PREFIX = "sha256:"


def result_digest(result: dict) -> str:
    """The digest of a result's content: SHA-256 of its canonical JSON (sorted keys, no spaces), the digest field
    itself left out. Python's JSON floats round-trip exactly, so the digest of a file read back equals the one
    written."""
    import hashlib

    content = {k: v for k, v in result.items() if k != DIGEST_FIELD}
    text = json.dumps(_jsonable(content), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return DIGEST_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()


def with_digest(result: dict) -> dict:
    """`result` (made JSON-safe) with its `digest` field: what `result.json` holds."""
    content = _jsonable({k: v for k, v in result.items() if k != DIGEST_FIELD})
    return {**content, DIGEST_FIELD: result_digest(content)}


#: The range of each metric a cell reports (`metrics` of result.json), by name or name suffix: a value outside it
#: was not computed by a scorer (a file edited by hand, a bug) and the cell is refused by the metric's name.
#: Probabilities, ROUGE-L, truth ratios (TOFU's reported forms), p-values (Forget Quality), accuracies, F1 and AUCs
#: lie in [0, 1]; RWKU's MIA LOSS scores are mean token log-likelihoods (<= 0); fluency is an entropy (>= 0).
UNIT_INTERVAL = (0.0, 1.0)
METRIC_RANGES: dict[str, tuple[float, float]] = {
    "forget_quality": UNIT_INTERVAL, "model_utility": UNIT_INTERVAL,
    **{name: UNIT_INTERVAL for name in ("forget_fb", "forget_qa", "forget_aa", "neighbor_fb", "neighbor_qa",
                                        "utility_mmlu", "utility_bbh", "utility_truthfulqa", "utility_triviaqa",
                                        "exact_memorization", "extraction_strength")},
    "mia_fm_loss": (-math.inf, 0.0), "mia_rm_loss": (-math.inf, 0.0), "utility_fluency": (0.0, math.inf),
}
METRIC_SUFFIX_RANGES: dict[str, tuple[float, float]] = {"_prob": UNIT_INTERVAL, "_rouge_l": UNIT_INTERVAL,
                                                        "_truth_ratio": UNIT_INTERVAL}
METRIC_PREFIX_RANGES: dict[str, tuple[float, float]] = {"mia_auc": UNIT_INTERVAL}   # every MIA attack's AUC


#: The benchmark plugins' own ranges (`api.Benchmark.metric_range`), reached through a function the benchmarks
#: package registers (`register_benchmark_ranges`): this layer imports no plugin registry.
_BENCHMARK_RANGES: list[Callable[[str, str], tuple[float, float] | None]] = []


def register_benchmark_ranges(lookup: Callable[[str, str], tuple[float, float] | None]) -> None:
    """Add `lookup(benchmark, metric)`, a benchmark's own range of a metric (None: it has none)."""
    if lookup not in _BENCHMARK_RANGES:
        _BENCHMARK_RANGES.append(lookup)


def metric_range(name: str, benchmark: str | None = None) -> tuple[float, float] | None:
    """The range of metric `name` (None: any finite number, e.g. privleak, a relative difference); a metric the
    tables do not name: the range its `benchmark` declares (`api.Benchmark.metric_range`), if any."""
    if name in METRIC_RANGES:
        return METRIC_RANGES[name]
    for prefix, bounds in METRIC_PREFIX_RANGES.items():
        if name.startswith(prefix):
            return bounds
    found = next((bounds for suffix, bounds in METRIC_SUFFIX_RANGES.items() if name.endswith(suffix)), None)
    if found is None and benchmark:
        found = next((b for lookup in _BENCHMARK_RANGES if (b := lookup(benchmark, name)) is not None), None)
    return found


def metrics_problem(metrics: dict, benchmark: str | None = None) -> str | None:
    """What is wrong with a result's `metrics` (None if nothing): every value a finite number or null (NaN is
    written as null), and in its range (`metric_range`, with its `benchmark`'s own) where it has one."""
    for name, value in metrics.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"metric {name} is {str(value)[:40]!r}, not a number"
        bounds = metric_range(name, benchmark)
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            return f"metric {name} = {value!r} is outside its range [{bounds[0]:g}, {bounds[1]:g}]"
    return None


def validate_result(result: Any, cell_hash: str | None = None) -> str | None:
    """What is wrong with a parsed `result.json` (None if nothing): schema version, required fields, types, that
    it is the result of the cell whose directory holds it, its digest (a result written with one must still match
    it: its numbers were not edited; one without is a result written before digests, read as it is), and every
    metric in its range (`metrics_problem`)."""
    if not isinstance(result, dict):
        return f"expected a JSON object, got {type(result).__name__}"
    version = result.get("schema_version")
    if future_schema(result, RESULT_SCHEMA_VERSION):
        return (f"schema_version {version!r}: written by a newer cru-harness (this one reads "
                f"{RESULT_SCHEMA_VERSION}); it is kept as it is, never recomputed over")
    if version != RESULT_SCHEMA_VERSION or isinstance(version, bool):
        return f"schema_version {version!r} is not {RESULT_SCHEMA_VERSION}"
    for name, kind in _RESULT_FIELDS.items():
        if not isinstance(result.get(name), kind):
            return f"field {name!r} is missing or not a {kind.__name__}"
    for name, kind in _OPTIONAL_RESULT_FIELDS.items():
        if name in result and not isinstance(result[name], kind):
            return f"field {name!r} has the wrong type ({type(result[name]).__name__})"
    if result["status"] not in STATUSES:
        return f"status {result['status']!r} is not one of {', '.join(STATUSES)}"
    if cell_hash is not None and result["hash"] != cell_hash:
        return f"it is the result of cell {result['hash']}, not of {cell_hash}"
    if DIGEST_FIELD in result and result[DIGEST_FIELD] != result_digest(result):
        return ("its content does not match its digest: it was changed after it was computed (edited by hand?); "
                "`cru-harness run` recomputes it")
    return metrics_problem(result["metrics"], result["benchmark"])


#: When results began to carry a digest (commit 0f95f19): a result without one whose record finished at or after
#: this instant was written by code that digests every result, so its digest was removed (an edit hidden).
DIGESTS_SINCE = "2026-11-26T19:28:42+00:00"


def missing_digest_problem(result: dict, record: dict | None) -> str | None:
    """A result without a digest is read as it is only when its record shows it was computed before digests."""
    if DIGEST_FIELD in result:
        return None
    finished = (record or {}).get("finished")
    try:
        before = datetime.fromisoformat(str(finished)) < datetime.fromisoformat(DIGESTS_SINCE)
    except (TypeError, ValueError):
        before = False
    if before:
        return None
    return (f"it has no digest, but its record (finished {str(finished)[:40]}) says it was computed by code that "
            "writes one: its digest was removed (edited by hand?); `cru-harness run` recomputes it")


class CellStoreError(UserError, RuntimeError):
    """A cell directory a run must not write: written by a newer cru-harness, or a link out of the run."""


def future_schema(data: Any, current: int) -> int | None:
    """The schema version of a parsed cell file when it is newer than this code's `current`, else None."""
    version = data.get("schema_version") if isinstance(data, dict) else None
    return version if isinstance(version, int) and not isinstance(version, bool) and version > current else None


def validate_record(record: Any, cell_hash: str | None = None) -> str | None:
    """What is wrong with a parsed `run_record.json` (None if nothing). A record without `schema_version` was
    written before the field existed: version 1."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    version = record.get("schema_version", 1)
    if version != RECORD_SCHEMA_VERSION or isinstance(version, bool):
        return f"schema_version {version!r} is not {RECORD_SCHEMA_VERSION}"
    if not isinstance(record.get("hash"), str):
        return "field 'hash' is missing or not a str"
    if cell_hash is not None and record["hash"] != cell_hash:
        return f"it is the record of cell {record['hash']}, not of {cell_hash}"
    return None


def _warn(message: str) -> None:
    print(message, file=sys.stderr)


class CellStore:
    """The cells of one run directory. `log` receives one line per invalid file met (once per file)."""

    def __init__(self, output_dir: str | os.PathLike, log: Callable[[str], None] | None = None):
        self.root = Path(output_dir)
        self.cells_dir = self.root / CELLS_DIR
        self.log = log or _warn
        self.invalid: dict[str, str] = {}   # path -> what is wrong with it

    def cell_dir(self, cell_hash: str) -> Path:
        return self.cells_dir / cell_hash

    def link_problem(self, cell_hash: str) -> str | None:
        """The first symbolic link among the run's cells/, the cell's directory, its files and its work/ (a run
        writes and deletes there: through a link it would write or delete outside the run), or None."""
        cdir = self.cell_dir(cell_hash)
        for path in (self.cells_dir, cdir, cdir / RESULT_FILE, cdir / RECORD_FILE, cdir / RUNNING_FILE,
                     cdir / WORK_DIR):
            if path.is_symlink():
                return f"{path} is a symbolic link: a run's cells are its own files, never followed out of it"
        return None

    def check_writable(self, cell_hash: str) -> None:
        """Raise `CellStoreError` when the cell must not be (re)computed here: a link in its path, or a result or
        record written by a newer cru-harness (kept as it is: recomputing would replace it, unread)."""
        problem = self.link_problem(cell_hash)
        if problem:
            raise CellStoreError(f"{problem}; remove the link (or copy what it points to) and run again")
        cdir = self.cell_dir(cell_hash)
        for name, current in ((RESULT_FILE, RESULT_SCHEMA_VERSION), (RECORD_FILE, RECORD_SCHEMA_VERSION)):
            try:
                data = read_json(cdir / name)
            except (OSError, ValueError):
                continue
            version = future_schema(data, current)
            if version:
                raise CellStoreError(f"{cdir / name} was written by a newer cru-harness (schema_version {version}; "
                                     f"this one reads {current}): it is left as it is; run with that version, or "
                                     "choose another output directory")

    def work_dir(self, cell_hash: str, fresh: bool = False) -> Path:
        self.check_writable(cell_hash)
        work = self.cell_dir(cell_hash) / WORK_DIR
        if fresh and work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True, exist_ok=True)
        return work

    def _invalid(self, path: Path, problem: str) -> None:
        if str(path) not in self.invalid:
            self.invalid[str(path)] = problem
            self.log(f"{path} is not a valid cell file ({problem}): its cell is not counted as done, and "
                     "`cru-harness run` recomputes it")

    def _read_checked(self, path: Path, validate, cell_hash: str):
        try:
            data = read_json(path)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            self._invalid(path, f"unreadable: {err}")
            return None
        problem = validate(data, cell_hash)
        if problem:
            self._invalid(path, problem)
            return None
        return data

    def load_result(self, cell_hash: str, quiet: bool = False) -> dict | None:
        """The cell's result if it is valid and so is its record; None if absent or invalid (reported unless
        `quiet`)."""
        if quiet:
            log, invalid = self.log, dict(self.invalid)
            self.log = lambda _: None
            try:
                return self.load_result(cell_hash)
            finally:
                self.log, self.invalid = log, invalid
        cdir = self.cell_dir(cell_hash)
        path = cdir / RESULT_FILE
        link = self.link_problem(cell_hash)
        if link and (path.exists() or path.is_symlink()):
            self._invalid(path, link)
            return None
        if not path.is_file():
            return None
        result = self._read_checked(path, validate_result, cell_hash)
        if result is None:
            return None
        if (cdir / RECORD_FILE).is_file():
            record = self._read_checked(cdir / RECORD_FILE, validate_record, cell_hash)
            if record is None:
                return None
        else:
            self._invalid(path, f"its {RECORD_FILE} is missing")
            return None
        problem = missing_digest_problem(result, record)
        if problem:
            self._invalid(path, problem)
            return None
        result.pop(DIGEST_FIELD, None)   # checked; readers see the content only
        return result

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

    def running_elsewhere(self, cell_hash: str) -> dict | None:
        """The RUNNING marker of a cell another live process of this host is computing (a shard of the same run),
        or None: not running, run by this process, by a dead process, or on another host (not judged)."""
        try:
            info = json.loads((self.cell_dir(cell_hash) / RUNNING_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(info, dict) or info.get("host") != socket.gethostname() or info.get("pid") == os.getpid():
            return None
        return info if _pid_alive(info.get("pid")) else None

    def wait_while_running_elsewhere(self, cell_hash: str, log: Callable[[str], None] | None = None,
                                     poll_s: float = 10.0) -> dict | None:
        """Wait while another live process computes the cell, then return its result (None: still none)."""
        info = self.running_elsewhere(cell_hash)
        if info is not None and log is not None:
            log(f"waiting for cell {cell_hash}, which process {info.get('pid')} is computing")
        while info is not None:
            time.sleep(poll_s)
            info = self.running_elsewhere(cell_hash)
        return self.load_result(cell_hash)

    def mark_running(self, cell_hash: str) -> None:
        """The cell is being computed (again): its previous result goes first, so that a run killed before the new
        one is written finds the cell interrupted, not finished with the old result beside the new record; so do
        temporary files a killed write left in it."""
        self.check_writable(cell_hash)
        cdir = self.cell_dir(cell_hash)
        if (self.load_result(cell_hash, quiet=True) or {}).get("status") == "ok":
            # a good result is replaced only by a good one: kept aside until the new one is known (`write`)
            for name in (RESULT_FILE, RECORD_FILE):
                os.replace(cdir / name, cdir / (PREVIOUS_PREFIX + name))
        for leftover in [cdir / RESULT_FILE, *cdir.glob(".*.tmp")]:
            leftover.unlink(missing_ok=True)
        atomic_write_json(self.cell_dir(cell_hash) / RUNNING_FILE, {"pid": os.getpid(), "started": now_iso(),
                                                                   "host": socket.gethostname()})

    def write(self, cell_hash: str, result: dict, record: dict) -> None:
        """Write the record, then the result, each stamped with its schema version; the result also with the
        digest of its content (`with_digest`)."""
        self.check_writable(cell_hash)
        cdir = self.cell_dir(cell_hash)
        previous = [cdir / (PREVIOUS_PREFIX + name) for name in (RESULT_FILE, RECORD_FILE)]
        if result.get("status") != "ok" and all(path.is_file() for path in previous):
            # the recompute failed: the good result it was to replace stays (and so do the cells built on it)
            for path, name in zip(previous, (RESULT_FILE, RECORD_FILE)):
                os.replace(path, cdir / name)
            self.log(f"cell {cell_hash}: the recompute ended {result.get('status')} "
                     f"({str(result.get('reason'))[:300]}); its earlier ok result is kept")
            (cdir / RUNNING_FILE).unlink(missing_ok=True)
            return
        atomic_write_json(cdir / RECORD_FILE, {"schema_version": RECORD_SCHEMA_VERSION, **record})
        atomic_write_json(cdir / RESULT_FILE, with_digest({"schema_version": RESULT_SCHEMA_VERSION, **result}))
        for path in previous:
            path.unlink(missing_ok=True)
        running = cdir / RUNNING_FILE
        if running.exists():
            running.unlink()

    def iter_results(self) -> Iterator[tuple[str, dict]]:
        """The valid results of the run; invalid files are reported (by path) and left out."""
        if not self.cells_dir.is_dir():
            return
        if self.cells_dir.is_symlink():
            self._invalid(self.cells_dir, f"{self.cells_dir} is a symbolic link: not followed")
            return
        for cdir in sorted(self.cells_dir.iterdir()):
            result = self.load_result(cdir.name) if cdir.is_dir() or cdir.is_symlink() else None
            if result is not None:
                yield cdir.name, result


def load_results(*dirs: str | os.PathLike, log: Callable[[str], None] | None = None) -> list[dict]:
    """Valid results of one or more run directories (or a `cells/` dir), deduplicated by hash: "ok" wins.
    Invalid result files are reported through `log` (stderr by default) and left out. Each result carries its
    record's `resolved_config` (all that determined it: the report tells settings apart by it)."""
    by_hash: dict[str, dict] = {}
    for directory in dirs:
        directory = Path(directory)
        if not directory.is_dir():
            raise MissingInputError(f"results directory not found: {directory}")
        root = directory.parent if directory.name == CELLS_DIR else directory
        store = CellStore(root, log=log)
        if not store.cells_dir.is_dir():
            raise MissingInputError(f"{directory} holds no `{CELLS_DIR}/` directory (not a cru-harness run)")
        for cell_hash, result in store.iter_results():
            record = store.load_record(cell_hash) or {}
            result = dict(result, hash=result.get("hash", cell_hash), resolved_config=record.get("resolved_config"))
            previous = by_hash.get(cell_hash)
            if previous is None or (previous.get("status") != "ok" and result.get("status") == "ok"):
                by_hash[cell_hash] = result
    return list(by_hash.values())


# ------------------------------------------------------------------------------------------- run directory
#: What a run, its shards, `merge`, `study` and `--reproduce` write at the top of a run directory.
RUN_ENTRIES = frozenset({CELLS_DIR, "report", "study", "target_selection", "reproduction.md", "reproduction.json"})


def _run_entry(name: str) -> bool:
    from .locations import WRITE_TEST_PREFIX

    return (name in RUN_ENTRIES or name.startswith((LOCK_FILE, WRITE_TEST_PREFIX))
            or (name.startswith("plan") and name.endswith(".json"))   # plan.json, plan.shard1of2.json, plan.input1.json
            or (name.startswith(".") and name.endswith((".tmp", ".lock"))))   # a killed write's leftover, a lock


def check_run_directory(output_dir: str | os.PathLike, name: str | None, what: str = "output_dir") -> None:
    """Refuse (`OutputLocationError`, before any work) an existing `output_dir` that is neither empty nor a run
    of the experiment `name`: a run writes plan.json, cells/ and report/ there, replacing files of those names.

    A run of `name` is a directory whose plan.json (or a shard's plan) records a config of that name; its cells are
    then reused by hash, as resuming does. Without a plan, a directory holding only what a run writes (a run
    stopped before its plan was written, `merge` output) is taken too. Anything else is refused, naming what is
    there. `name` None (`merge --out`): a run of any experiment is taken."""
    from .locations import OutputLocationError

    root = Path(output_dir).expanduser()
    if not root.is_dir():
        return   # absent (created by the run), or a file: check_output_dir names that
    entries = sorted(root.iterdir(), key=lambda entry: entry.name)
    plans = [entry for entry in entries if entry.name.startswith("plan") and entry.name.endswith(".json")
             and entry.is_file()]
    others: list[str] = []
    for plan in plans:
        try:
            recorded = read_json(plan)
        except (OSError, ValueError) as err:
            raise OutputLocationError(f"{what} {root} holds a {plan.name} that cannot be read ({err}): not a run "
                                      "of this config; choose a new or empty directory") from None
        config = recorded.get("config") if isinstance(recorded, dict) else None
        recorded_name = config.get("name") if isinstance(config, dict) else None
        if name is None or recorded_name == name:
            return
        others.append(excerpt(recorded_name, 80) if isinstance(recorded_name, str)
                      else f"no experiment ({plan.name})")
    if others:
        raise OutputLocationError(f"{what} {root} holds the run of another experiment ({', '.join(sorted(set(others)))}"
                                  f", not {excerpt(name, 80)}): choose a new or empty directory, or that run's config")
    foreign = [entry.name + ("/" if entry.is_dir() else "") for entry in entries if not _run_entry(entry.name)]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise OutputLocationError(f"{what} {root} is not empty and is not a cru-harness run (it holds {shown}): a "
                                  "run would write plan.json, cells/ and report/ among them; choose a new or empty "
                                  "directory")


# --------------------------------------------------------------------------------------------------- run lock
@contextmanager
def waiting_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock (`filelock`) on `path`, waiting while another process (a shard of the same run)
    holds it. The file stays: removing it would let a waiter lock an unlinked file while a newcomer locks a new
    one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path):
        yield


class RunLockedError(UserError, RuntimeError):
    """Another live process runs in the same output directory."""


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError) as err:
        return isinstance(err, PermissionError)  # exists, owned by someone else
    return True


class RunLock:
    """Exclusive use of a run's output directory by one process, or shared by the shards of one run (see the module
    doc), with `filelock` locks (flock; filelock's own fallback where the file system has none).

    A full run holds `.lock` for its whole length and refuses to start while any shard lock `.lock.shardIofN` is
    held. A shard takes `.lock` for an instant (other shards wait for it briefly; a full run holding it refuses
    the shard), then holds its own shard lock. Locks die with their process, so a lock left by a killed run is
    free: it is taken over with a message naming the dead holder (its record is still in the file). Every lock
    file is removed when its run ends (the directory lock: with the last shard); a locker therefore checks, once
    locked, that the path still names the file it locked.
    """

    #: How long a shard waits for another shard's instant on `.lock` before refusing (a full run holds it).
    SHARD_WAIT_S = 3.0

    def __init__(self, output_dir: str | os.PathLike, shard: str | None = None,
                 log: Callable[[str], None] = print):
        self.root = Path(output_dir)
        self.shard = shard
        self.log = log
        self._held: list[tuple[Path, Any]] = []   # (path, held FileLock): removed and released in reverse

    def _shard_path(self) -> Path:
        return self.root / f"{LOCK_FILE}.shard{self.shard.replace('/', 'of')}"

    def _holders(self, path: Path) -> str:
        """Who holds `path`: its own record, and for the directory lock, each shard's record."""
        infos = [_read_lock_info(path)]
        if path.name == LOCK_FILE:
            infos += [_read_lock_info(p) for p in sorted(self.root.glob(f"{LOCK_FILE}.shard*"))]
        described = [describe_holder(i) for i in infos if i]
        return "; ".join(described) or describe_holder(None)

    def _busy(self, path: Path) -> "RunLockedError":
        info = _read_lock_info(path)
        gone = bool(info) and info.get("host") == socket.gethostname() and not _pid_alive(info.get("pid"))
        hint = ("; that process is gone but its lock is still held (a file system without flock keeps it): delete "
                "the lock file if no run uses this directory") if gone else \
            "; wait for that run to finish, or give another --output-dir"
        return RunLockedError(f"output directory {self.root} is in use by {self._holders(path)} (lock file {path})"
                              + hint)

    @staticmethod
    def _try(path: Path, wait_s: float = 0.0):
        """The held FileLock of `path`, or None when another process holds it (tried for `wait_s`)."""
        from filelock import Timeout

        deadline = time.monotonic() + wait_s
        for _ in range(1000):
            lock = file_lock(path, timeout=0, thread_local=False)
            try:
                lock.acquire()
            except Timeout:
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.02)
                continue
            fd = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
            try:   # a finishing holder may have removed the file between our open and lock: lock the new one
                if fd is None or os.path.samestat(os.fstat(fd), os.stat(path)):
                    return lock
            except FileNotFoundError:
                pass
            lock.release()
        raise RunLockedError(f"lock file {path} keeps being replaced; is another run starting and stopping?")

    def acquire(self) -> "RunLock":
        self.root.mkdir(parents=True, exist_ok=True)
        main = self.root / LOCK_FILE
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": now_iso(), "shard": self.shard}
        try:
            own = self._shard_path() if self.shard else main
            previous = _read_lock_info(own)   # before locking: the winner of a lock empties its file
            lock = self._try(main, self.SHARD_WAIT_S if self.shard else 0.0)
            if lock is None:
                raise self._busy(main)
            if self.shard:
                shard_lock = self._try(self._shard_path())
                if shard_lock is None:
                    lock.release()
                    raise self._busy(self._shard_path())
                lock.release()   # the shards share the directory; the shard lock keeps full runs out
                self._held.append((self._shard_path(), shard_lock))
            else:
                self._held.append((main, lock))
                for shard in sorted(self.root.glob(f"{LOCK_FILE}.shard*")):
                    if not self._free(shard):   # a killed shard's is removed
                        raise self._busy(shard)
            if previous and previous.get("pid") != os.getpid():
                self.log(f"taking over the lock {own} left by {describe_holder(previous)}, which is no longer "
                         "running")
            _write_lock_info(own, info)
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        """Remove the lock files this run holds (the directory lock of shards: when the last one ends)."""
        for path, lock in reversed(self._held):
            try:
                path.unlink(missing_ok=True)   # while still locked: lockers check the path names their file
            finally:
                lock.release()
        if self.shard and self._held:
            main = self.root / LOCK_FILE
            lock = self._try(main)
            if lock is not None:
                try:
                    if all(self._free(p) for p in self.root.glob(f"{LOCK_FILE}.shard*")):
                        main.unlink(missing_ok=True)
                finally:
                    lock.release()
        self._held = []

    def _free(self, path: Path) -> bool:
        """Whether no process holds lock file `path` (a killed shard's is removed)."""
        lock = self._try(path)
        if lock is None:
            return False
        try:
            path.unlink(missing_ok=True)
        finally:
            lock.release()
        return True

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_lock_info(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "null")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _write_lock_info(path: Path, info: dict) -> None:
    # In place (not os.replace): the flock belongs to this inode.
    with open(path, "r+", encoding="utf-8") as handle:
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(info) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
