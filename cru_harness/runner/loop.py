"""The run loop: skip finished cells, resume interrupted ones, record everything about each cell.

An executor is any callable `executor(cell, workdir) -> dict` returning the executed part of a result:
`metrics`, `per_item`, `failure_classes`, `gate_means`, `resources`, `artifacts`, `details` (all optional).
It raises `CellUnavailable(reason)` when the cell cannot run for a reason outside the code (a PURGE checkpoint
that is not published or not reachable): the cell is recorded with status "unavailable", never a crash.
Any other exception is recorded as status "failed" with its traceback, and the run goes on.
The real executor is `runner.execute.PlanExecutor`; tests inject fake executors to exercise the machinery.
"""
from __future__ import annotations

import gc
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

from tqdm import tqdm

from ..api import CellUnavailable  # noqa: F401  (raised by executors and plugins; re-exported)
from ..store import RESULT_SCHEMA_VERSION, CellStore, environment_record, now_iso
from .plan import Cell
from .models import resolve_device
from .provenance import code_version, hub_revisions, stale_fields

Executor = Callable[[Cell, Path], dict]



class PeakRSSSampler:
    """Peak resident memory of this process *during* a block (sampled), unlike ru_maxrss's lifetime maximum."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()

    def _rss(self) -> int:
        import psutil  # a declared dependency: a failure here is a bug, not a peak of 0

        return int(psutil.Process().memory_info().rss)

    def _loop(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            self._stop.wait(self.interval)

    def __enter__(self):
        self.peak = self._rss()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())


class CudaPeak:
    """Peak GPU memory of a block on every visible GPU (torch's allocator high-water mark from the start, training's
    own reset included: `training.resources.cuda_peak`), and the GPUs' names: what a cell on `cuda` used, loading
    and evaluation included (training's own peak is `train_peak_*`). What an earlier cell left unreferenced is
    collected and its cached blocks released first, so that it is not counted. Inactive (records nothing) when
    the cell's device is not CUDA."""

    def __init__(self, device: str):
        self.active = str(device).startswith("cuda")
        self.peak_bytes: int | None = None
        self.gpus: list[str] = []

    def __enter__(self):
        if self.active:
            import torch

            from ..training.resources import begin_cuda_peak

            self.active = torch.cuda.is_available()
            if self.active:
                gc.collect()  # a model kept alive only by a reference cycle would otherwise stay on the GPU
                try:
                    torch.cuda.empty_cache()
                    for index in range(torch.cuda.device_count()):
                        begin_cuda_peak(index)
                except RuntimeError:  # CUDA broken (an earlier cell's error): the cell records its own failure
                    self.active = False
        return self

    def __exit__(self, *exc):
        if self.active:
            import torch

            from ..training.resources import cuda_peak

            try:
                count = torch.cuda.device_count()
                for index in range(count):
                    torch.cuda.synchronize(index)
                self.peak_bytes = max(cuda_peak(index) for index in range(count))
                self.gpus = [torch.cuda.get_device_name(index) for index in range(count)]
            except RuntimeError:  # a CUDA error left by the failed cell: its own error is what gets recorded
                self.peak_bytes, self.gpus = None, []

    def resources(self) -> dict[str, Any]:
        if self.peak_bytes is None:
            return {}
        return {"cell_peak_cuda_memory_bytes": self.peak_bytes, "gpu_name": ", ".join(dict.fromkeys(self.gpus)),
                "gpu_count": len(self.gpus)}


def result_header(cell: Cell) -> dict[str, Any]:
    return {"schema_version": RESULT_SCHEMA_VERSION, "hash": cell.hash, "kind": cell.kind,
            "method": cell.method, "label": cell.label, "model": cell.model.name, "model_path": cell.model.path,
            "benchmark": cell.benchmark, "split": cell.split, "target": cell.target, "unit": cell.unit,
            "seed": cell.seed, "hparams": cell.hparams}


def code_inputs(cell: Cell) -> dict[str, Any]:
    """The inputs checked when no others are given: the code version (see `runner.provenance`)."""
    return {"code_version": code_version()}


def run_cells(cells: Iterable[Cell], store: CellStore, executor: Executor, *, log: Callable[[str], None] = print,
              force: bool = False, inputs: Callable[[Cell], dict] = code_inputs,
              reference_walls: dict[str, float] | None = None) -> dict[str, int]:
    """Run every unfinished cell, one at a time. Returns counts per outcome (skipped, ok, failed, unavailable,
    and stale: finished cells recomputed because `inputs(cell)` differs from what their record saved).

    A finished cell is reused only when its saved inputs (code version; with `provenance.cell_inputs` also model,
    data and library fingerprints) equal the current ones: resuming one's own run skips it, a cell computed by
    other code is recomputed. `reference_walls` ({cell hash: seconds}, `recorded_walls` of a reference run) makes the
    time-left estimate each cell's own time there (`time_left`)."""
    cells = list(cells)
    for cell in cells:   # before any work: a cell of a newer cru-harness, or a link out of the run, stops it
        store.check_writable(cell.hash)
    counts = {"skipped": 0, "stale": 0, "ok": 0, "failed": 0, "unavailable": 0}
    computed: list[tuple[Cell, float]] = []   # the cells this call computed, with their wall times
    # One line per cell when it ends; while it runs, a bar names it (tqdm writes to stderr, the lines go to `log`).
    bar = tqdm(total=len(cells), desc="cells", unit="cell", leave=False, dynamic_ncols=True, disable=None)

    def log_line(message: str) -> None:
        with tqdm.external_write_mode():
            log(message)

    with bar:
        _run_each(cells, store, executor, bar, log_line, force, inputs, counts, computed, reference_walls)
    return counts


def _run_each(cells, store, executor, bar, log, force, inputs, counts, computed, reference_walls=None) -> None:
    for position, cell in enumerate(cells, start=1):
        tag = f"[{position}/{len(cells)}] {cell.hash} {cell.describe()}"
        try:
            current = inputs(cell)
        except Exception as err:  # noqa: BLE001 - e.g. a model that cannot be built: the cell records the error
            current = {"error": f"inputs could not be determined: {type(err).__name__}: {err}"}
        if not force and store.is_finished(cell.hash):
            stale = ["inputs (undeterminable)"] if "error" in current else \
                stale_fields(store.load_record(cell.hash), current)
            if not stale:
                counts["skipped"] += 1
                log(f"{tag}: finished earlier, skipped")
                bar.update(1)
                continue
            counts["stale"] += 1
            log(f"{tag}: finished earlier with another {' / '.join(stale)}; recomputing")
        if store.was_interrupted(cell.hash):
            log(f"{tag}: interrupted earlier; recomputing from scratch")
        workdir = store.work_dir(cell.hash, fresh=True)
        store.mark_running(cell.hash)
        bar.set_postfix_str(f"running {cell.describe()}", refresh=True)
        try:
            device = resolve_device(cell.device)
        except Exception:  # noqa: BLE001 - a device that is not there: the executor fails the cell, naming it
            device = cell.device
        result, record = run_one(cell, workdir, executor, device=device)
        record["inputs"] = current
        try:   # after the cell ran, before its result is written: nothing here may cost the result
            revisions = {} if "error" in current else hub_revisions(cell.benchmark, current)
        except Exception as err:  # noqa: BLE001 - named in the record, as undeterminable inputs are
            revisions = {"error": f"{type(err).__name__}: {err}"}
        if revisions:
            record["hub_revisions"] = revisions
        record["device"] = device
        store.write(cell.hash, result, record)
        counts[result["status"]] += 1
        suffix = f" ({result.get('reason')})" if result.get("reason") else ""
        wall = result["resources"].get("cell_wall_time_s", 0)
        computed.append((cell, wall))
        left = time_left(computed, cells[position:], reference_walls)
        log(f"{tag}: {result['status']}{suffix} in {wall:.1f}s{left}")
        bar.update(1)


def cost_kind(cell) -> tuple:
    """What a cell's wall time follows: its kind, its method and its attack (a fine-tune, an NPO training, a relearn
    attack and a scoring of the Original differ by orders of magnitude)."""
    attack = ((getattr(cell, "extra", None) or {}).get("attack") or {}).get("name")
    return (cell.kind, cell.method, attack)


def estimate_seconds(cell, done: list[tuple[Any, float]], reference: dict[str, float] | None = None) -> float | None:
    """A cell's expected wall time: its own time in a reference run (`--reproduce`: the same cell there), scaled by
    this machine's pace on the cells both have; else the mean of the cells of its kind computed so far; else of those
    of its kind (`Cell.kind`); else of every cell computed so far (None before any)."""
    reference = reference or {}
    if cell.hash in reference:
        pairs = [(wall, reference[c.hash]) for c, wall in done if reference.get(c.hash)]
        pace = sum(w for w, _ in pairs) / sum(r for _, r in pairs) if pairs else 1.0
        return reference[cell.hash] * pace
    for same in (lambda c: cost_kind(c) == cost_kind(cell), lambda c: c.kind == cell.kind, lambda c: True):
        walls = [wall for c, wall in done if same(c)]
        if walls:
            return sum(walls) / len(walls)
    return None


def time_left(done: list[tuple[Any, float]], remaining: list, reference: dict[str, float] | None = None) -> str:
    """"; about 12 min left for 9 more cells": each cell not yet reached at its kind's measured cost
    (`estimate_seconds`); too high when some of them finished earlier. Empty when nothing is left or measured."""
    if not remaining:
        return ""
    estimates = [estimate_seconds(cell, done, reference) for cell in remaining]
    if any(seconds is None for seconds in estimates):
        return ""
    seconds = sum(estimates)
    text = f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{max(1, round(seconds / 60))} min"
    return f"; about {text} left for {len(remaining)} more cell{'s' if len(remaining) > 1 else ''}"


def recorded_walls(run_dir) -> dict[str, float]:
    """{cell hash: wall time} of a run directory's finished cells (a reference run, e.g. the demo's committed one)."""
    walls = {}
    for cell_hash, result in CellStore(run_dir, log=lambda _message: None).iter_results():
        wall = (result.get("resources") or {}).get("cell_wall_time_s")
        if result.get("status") == "ok" and isinstance(wall, (int, float)) and wall > 0:
            walls[cell_hash] = float(wall)
    return walls


def run_one(cell: Cell, workdir: Path, executor: Executor, *, device: str = "cpu") -> tuple[dict, dict]:
    """Run one cell: its result (status, reason and traceback when it fails) and its run record (wall time, peak
    RSS, and on CUDA the GPUs' names and peak GPU memory of the whole cell)."""
    started_iso, t0 = now_iso(), time.perf_counter()
    status, reason, error, outcome = "ok", None, None, {}
    with PeakRSSSampler() as sampler, CudaPeak(device) as cuda:
        try:
            outcome = executor(cell, workdir) or {}
        except CellUnavailable as err:
            status, reason, outcome = "unavailable", err.reason, {"details": err.details}
        except Exception as err:  # recorded, and the run goes on to the next cell
            status, reason = "failed", f"{type(err).__name__}: {err}"
            error = traceback.format_exc()
    wall = time.perf_counter() - t0
    resources = dict(outcome.get("resources") or {})
    resources.setdefault("cell_wall_time_s", wall)
    resources.setdefault("cell_peak_rss_bytes", sampler.peak)
    resources.update(cuda.resources())
    result = {**result_header(cell), "status": status, "reason": reason,
              "metrics": outcome.get("metrics", {}), "failure_classes": outcome.get("failure_classes", {}),
              "gate_means": outcome.get("gate_means"), "resources": resources,
              "per_item": outcome.get("per_item", {}), "artifacts": outcome.get("artifacts", {}),
              "details": outcome.get("details", {}), "error": error}
    record = {"hash": cell.hash, "resolved_config": cell.resolved(), "started": started_iso, "finished": now_iso(),
              "wall_time_s": wall, "peak_rss_bytes": sampler.peak, "status": status, **cuda.resources(),
              **environment_record()}
    return result, record
