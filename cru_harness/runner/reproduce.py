"""Does a run reproduce a reference run? Every cell, every number, with the tolerance stated per metric.

`compare_runs(run, reference)` pairs the cells of two run directories by cell hash (the hash of the resolved
config: the same cell in every run of a config) and compares every number of each result: `metrics`,
`failure_classes` and the CRU `gate_means`. `write_reproduction` writes `reproduction.md` (and
`reproduction.json`) beside the run and returns the comparison, whose `verdict` is one line.

Tolerances (`tolerance_for`): on CPU, two cells computed at the same torch thread count are compared exactly.
The CPU computation is deterministic: float32, seeded initialisation, data order and lm-eval, deterministically
trained tokenizers, the chat template's date pinned; and JSON keeps a float's every bit. Across thread counts it
is not quite: MKL takes another path for matrix products of few rows when the thread count changes, forward
passes included, which moves the last bits of a float32 result. Measured on the demo (benchmarks/results/
demo_reproduction_2threads.md): 17 of 18 cells bit-identical between 1 and 2 threads, one CRU cell within 5e-7.
So CPU cells at different thread counts get `CROSS_THREAD` (1e-6 absolute, twice that maximum); a greedy
answer that flips moves a metric by far more and still shows. Testbed models and CRU's sums and router weight
gradients are thread-invariant by construction (`cru_harness.reductions`; tests/test_reproducibility.py). The
report shows both runs' thread counts and says so when they lie outside 1-2, where nothing was measured. On a
GPU, cuBLAS reductions and atomic adds in backward passes are not bitwise reproducible and the differences grow
through training, so GPU cells get a tolerance per metric (`GPU_TOLERANCES`; an estimate, not measured in this
project: the CI and the demo run on CPU).

Besides the numbers, each cell's saved inputs (code version, model and data fingerprints, library versions;
`runner.provenance`) and the Hub revisions its record names are compared, so a mismatch says whether the
reference was computed by other code (a stale reference, to be regenerated) or from a dirty tree (never
reproducible from a commit).
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MissingInputError
from ..store import CellStore, atomic_write_json, atomic_write_text
from .plan import cell_title
from .provenance import INPUT_FIELDS, code_record, recorded_hub_revisions

REPORT_FILE = "reproduction.md"
JSON_FILE = "reproduction.json"
NUMBER_GROUPS = ("metrics", "failure_classes", "gate_means")


@dataclass(frozen=True)
class Tolerance:
    absolute: float
    why: str

    def admits(self, reference: float, value: float) -> bool:
        return abs(reference - value) <= self.absolute


EXACT = Tolerance(0.0, "CPU at the same torch thread count: seeded float32 training and evaluation are "
                       "deterministic; JSON keeps every bit")
CROSS_THREAD = Tolerance(1e-6, "CPU at different torch thread counts: MKL computes matrix products of few rows "
                               "another way, moving float32 results in the last bits (measured on the demo between 1 "
                               "and 2 threads: 17 of 18 cells identical, one within 5e-7; bound: twice that); a "
                               "flipped greedy answer moves a metric far more and still shows")
# Thread counts at which the cross-thread bound was measured. Elsewhere MKL may block GEMMs differently again.
MEASURED_THREADS = (1, 2)
# metric name pattern -> tolerance on a GPU (first match wins). Greedy-decoded text metrics move in steps of one
# answer out of N, so they get the widest band; probabilities and truth ratios move continuously.
GPU_TOLERANCES: tuple[tuple[str, Tolerance], ...] = (
    ("*forget_quality", Tolerance(0.02, "KS p-value of ~40-400 truth ratios; nondeterministic GPU reductions "
                                        "(estimate, unmeasured)")),
    ("*_prob", Tolerance(0.01, "mean answer probability; GPU reductions are not bitwise reproducible "
                               "(estimate, unmeasured)")),
    ("*truth_ratio", Tolerance(0.01, "mean truth ratio; GPU reductions (estimate, unmeasured)")),
    ("*mia_*_loss", Tolerance(0.05, "mean NLL; GPU reductions (estimate, unmeasured)")),
    ("*", Tolerance(0.05, "greedy-decoded answers and accuracies: a flipped token changes one answer of N; GPU "
                          "reductions (estimate, unmeasured)")),
)


def tolerance_for(metric: str, device: str | None, threads: tuple = (None, None)) -> Tolerance:
    """The tolerance of one number of a cell run on `device`; `threads`: the torch thread counts of the reference's
    and the run's cell (see module doc)."""
    if not device or device == "cpu":
        return CROSS_THREAD if cross_thread(threads) else EXACT
    for pattern, tolerance in GPU_TOLERANCES:
        if fnmatch.fnmatchcase(metric, pattern):
            return tolerance
    return EXACT


def cross_thread(threads: tuple) -> bool:
    """Were the two cells computed at different, recorded thread counts?"""
    reference, run = threads
    return reference is not None and run is not None and reference != run


def result_numbers(result: dict) -> dict[str, Any]:
    """Every number of a cell result, flattened: `metrics.forget_rouge_l`, `failure_classes.forget.refusal`,
    `gate_means.forget`, ... (None stays None: a metric that was not computed)."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key in sorted(value):
                walk(f"{prefix}.{key}", value[key])
        elif value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            flat[prefix] = value

    for group in NUMBER_GROUPS:
        if result.get(group) is not None:
            walk(group, result[group])
    return flat


@dataclass
class NumberDiff:
    cell: str
    name: str
    reference: float | None
    value: float | None
    tolerance: float

    @property
    def delta(self) -> float | None:
        if self.reference is None or self.value is None:
            return None
        return self.value - self.reference


@dataclass
class CellComparison:
    hash: str
    cell: str
    status: str                     # match | differs | missing | status
    n_numbers: int = 0
    diffs: list[NumberDiff] = field(default_factory=list)
    inputs_differ: list[str] = field(default_factory=list)   # INPUT_FIELDS, and hub_revisions
    reference_dirty: bool = False
    device: str | None = None
    threads: tuple = (None, None)   # torch threads of the reference's and the run's cell
    cpus: tuple = (None, None)      # CPU instruction sets (torch's cpu_capability) of the reference's and the run's


@dataclass
class Comparison:
    run: str
    reference: str
    cells: list[CellComparison]
    extra: list[str]                # cells of the run the reference does not have
    run_code: dict
    reference_code_versions: list[str]
    reference_commits: list[str]
    selections: dict[str, tuple] = field(default_factory=dict)   # model -> (reference's, run's) RWKU targets
    # what computed the run's compared cells, from their records (`run_code` is the comparing process's)
    run_code_versions: list[str] = field(default_factory=list)
    run_commits: list[str] = field(default_factory=list)

    @property
    def reproduced(self) -> bool:
        return bool(self.cells) and all(c.status == "match" for c in self.cells)

    def count(self, status: str) -> int:
        return sum(1 for c in self.cells if c.status == status)

    @property
    def stale_reference(self) -> int:
        """Reference cells whose saved code version differs from the run's (or is not recorded)."""
        return sum(1 for c in self.cells if "code_version" in c.inputs_differ)

    @property
    def verdict(self) -> str:
        n = len(self.cells)
        numbers = sum(c.n_numbers for c in self.cells)
        if not n:
            return f"NOT REPRODUCED: the reference {self.reference} holds no finished cells"
        if self.reproduced:
            line = f"REPRODUCED: all {n} cells of {self.reference}, {numbers} numbers within tolerance"
            if any(c.device not in (None, "cpu") for c in self.cells):
                return line + " (per-metric tolerances: GPU)"
            if any(cross_thread(c.threads) for c in self.cells):
                return line + f" (CPU: exact at the same thread count, within {CROSS_THREAD.absolute:g} across)"
            return line + " (exact: CPU)"
        parts = []
        if self.count("differs"):
            n_diffs = sum(len(c.diffs) for c in self.cells)
            parts.append(f"{self.count('differs')} of {n} cells differ beyond tolerance ({n_diffs} numbers)")
        if self.count("status"):
            parts.append(f"{self.count('status')} cells finished with another status")
        if self.count("missing"):
            parts.append(f"{self.count('missing')} cells missing from the run")
        why = []
        if self.stale_reference:
            why.append(f"{self.stale_reference} reference cells were computed by other code (stale reference)")
        dirty = sum(1 for c in self.cells if c.reference_dirty)
        if dirty:
            why.append(f"{dirty} reference cells come from a dirty tree")
        for name in ("models", "data", "libraries", "hub_revisions"):
            k = sum(1 for c in self.cells if name in c.inputs_differ)
            if k:
                why.append(f"{k} with other {name.replace('hub_revisions', 'Hub revisions')}")
        return "NOT REPRODUCED: " + "; ".join(parts) + (f" [{'; '.join(why)}]" if why else "")

    def to_dict(self) -> dict:
        return {"run": self.run, "reference": self.reference, "verdict": self.verdict,
                "reproduced": self.reproduced, "run_code": self.run_code,
                "run_code_versions": self.run_code_versions, "run_commits": self.run_commits,
                "reference_code_versions": self.reference_code_versions,
                "reference_commits": self.reference_commits, "extra_cells": self.extra,
                # the units `select_known` chose per model (reference's, run's); named `rwku_selections` before
                "target_selections": {m: list(pair) for m, pair in self.selections.items()},
                "cells": [{**asdict(c), "diffs": [{**asdict(d), "delta": d.delta} for d in c.diffs]}
                          for c in self.cells]}


def _describe(result: dict) -> str:
    target = result.get("target")
    unit = result.get("unit") or result.get("split") or (None if target is None else f"target{target}")
    return cell_title(result.get("model"), result.get("benchmark"), unit, result.get("label"), result.get("seed"))


def _device(record: dict | None) -> str | None:
    resolved = (record or {}).get("resolved_config") or {}
    return (record or {}).get("device") or resolved.get("device")


def saved_inputs(record: dict | None) -> dict:
    """The inputs a cell's record saved (`runner.provenance`); the code version alone for older records."""
    inputs = dict((record or {}).get("inputs") or {})
    if "code_version" not in inputs and (record or {}).get("code_version"):
        inputs["code_version"] = record["code_version"]
    return inputs


def compare_cell(cell_hash: str, reference: dict, ref_record: dict | None, result: dict | None,
                 record: dict | None, run_code_version: str | None = None) -> CellComparison:
    """One reference cell against the run's cell of the same hash (`result` None: the run lacks it). Without a
    run record, the reference's code version is compared with `run_code_version` (the run's code)."""
    device = _device(record) or _device(ref_record)
    comparison = CellComparison(hash=cell_hash, cell=_describe(reference), status="match", device=device,
                                reference_dirty=bool(((ref_record or {}).get("git") or {}).get("dirty")),
                                threads=((ref_record or {}).get("torch_threads"),
                                         (record or {}).get("torch_threads")),
                                cpus=((ref_record or {}).get("cpu_capability"),
                                      (record or {}).get("cpu_capability")))
    saved_ref = saved_inputs(ref_record)
    saved_run = saved_inputs(record) if record is not None else (
        {"code_version": run_code_version} if run_code_version else {})
    comparison.inputs_differ = [name for name in INPUT_FIELDS
                                if name in saved_run and saved_ref.get(name) != saved_run.get(name)]
    # Hub data and models are fingerprinted by name only; the revisions the records name tell two apart.
    ref_hub, run_hub = recorded_hub_revisions(ref_record), recorded_hub_revisions(record)
    if any(ref_hub[repo] != run_hub[repo] for repo in ref_hub.keys() & run_hub.keys()):
        comparison.inputs_differ.append("hub_revisions")
    if result is None:
        comparison.status = "missing"
        return comparison
    if result.get("status") != reference.get("status"):
        comparison.status = "status"
    ref_numbers, numbers = result_numbers(reference), result_numbers(result)
    comparison.n_numbers = len(set(ref_numbers) | set(numbers))
    for name in sorted(set(ref_numbers) | set(numbers)):
        ref_value, value = ref_numbers.get(name, "absent"), numbers.get(name, "absent")
        tolerance = tolerance_for(name.split(".", 1)[-1], device, comparison.threads)
        if ref_value == value:
            continue
        same = (isinstance(ref_value, (int, float)) and isinstance(value, (int, float))
                and math.isfinite(ref_value) and math.isfinite(value) and tolerance.admits(ref_value, value))
        if not same:
            comparison.diffs.append(NumberDiff(cell=comparison.cell, name=name,
                                               reference=ref_value if ref_value != "absent" else None,
                                               value=value if value != "absent" else None,
                                               tolerance=tolerance.absolute))
    if comparison.diffs and comparison.status == "match":
        comparison.status = "differs"
    return comparison


def compare_runs(run_dir: str | Path, reference_dir: str | Path) -> Comparison:
    """Compare every finished cell of `reference_dir` with the same cell (by hash) of `run_dir`."""
    run_store, ref_store = CellStore(run_dir), CellStore(reference_dir)
    if not ref_store.cells_dir.is_dir():
        raise MissingInputError(f"{reference_dir} holds no cells/ directory (not a cru-harness run)")
    run_results, ref_results = _as_reported(run_store), _as_reported(ref_store)
    run_code = code_record()
    cells, ref_records, run_records = [], [], []
    for cell_hash, reference in ref_results.items():
        ref_record, record = ref_store.load_record(cell_hash), run_store.load_record(cell_hash)
        ref_records.append(ref_record)
        if cell_hash in run_results:
            run_records.append(record)
        cells.append(compare_cell(cell_hash, reference, ref_record, run_results.get(cell_hash), record,
                                  run_code["code_version"]))
    reference_hashes = {c.hash for c in cells}
    extra = [_describe(result) for cell_hash, result in run_results.items() if cell_hash not in reference_hashes]
    (ref_versions, ref_commits), (run_versions, run_commits) = records_code(ref_records), records_code(run_records)
    return Comparison(run=str(run_dir), reference=str(reference_dir), cells=cells, extra=extra,
                      run_code=run_code, reference_code_versions=ref_versions, reference_commits=ref_commits,
                      selections=_selections(run_store, ref_store), run_code_versions=run_versions,
                      run_commits=run_commits)


def _as_reported(store: CellStore) -> dict[str, dict]:
    """A run's results by hash with the Forget Quality and privleak the report fills in
    (`reporting.tables.fill_from_oracle`): a cell scored before its retain cell existed (another shard's) has
    neither against the oracle in its file, and its report computes them from the two cells' numbers. Compared as
    reported, such a cell is not a difference."""
    from ..reporting.tables import fill_from_oracle

    results = {cell_hash: dict(result, hash=cell_hash, metrics=dict(result.get("metrics") or {}))
               for cell_hash, result in store.iter_results()}
    fill_from_oracle(list(results.values()))
    return results


def records_code(records) -> tuple[list[str], list[str]]:
    """The code versions and commits (a dirty tree marked) that run records name, sorted: what computed a set of
    cells."""
    versions, commits = set(), set()
    for record in records:
        git = (record or {}).get("git") or {}
        versions.add(str(saved_inputs(record).get("code_version") or "not recorded"))
        commits.add(f"{git.get('commit') or 'unknown'}{' (dirty)' if git.get('dirty') else ''}")
    return sorted(versions), sorted(commits)


def _selections(run_store: CellStore, ref_store: CellStore) -> dict[str, tuple]:
    """Model -> (reference's, run's) RWKU targets chosen by `select_known` (None where a side has none)."""
    from ..store import read_recorded_json
    from .targets import SELECTION_DIR

    chosen: dict[str, list] = {}
    for side, store in enumerate((ref_store, run_store)):
        for path in sorted((store.root / SELECTION_DIR).glob("*.json")):
            record = read_recorded_json(path, "the RWKU target choice")  # damaged: named, never "no choice"
            chosen.setdefault(record.get("model", path.stem), [None, None])[side] = record.get("chosen")
    return {model: tuple(pair) for model, pair in chosen.items()}


def _fmt(value: Any) -> str:
    return "—" if value is None else (f"{value:.6g}" if isinstance(value, float) else str(value))


def _cell(text: str) -> str:
    """A cell description inside a Markdown table (its ` | ` separators escaped)."""
    return text.replace("|", "\\|")


def _per_side(cells, value, label: str, missing: str | None) -> tuple[list[str], set]:
    """A line per side (reference, this run) naming the values `value(cell, side)` its cells recorded, `missing`
    when none (None: no line then); and the values both sides recorded."""
    lines, every = [], set()
    for side, name in ((0, "reference"), (1, "this run")):
        seen = {value(cell, side) for cell in cells} - {None}
        every |= seen
        if seen or missing:
            lines.append(f"- {label}, {name}: {', '.join(map(str, sorted(seen))) or missing}")
    return lines, every


def comparison_markdown(comparison: Comparison) -> str:
    git = comparison.run_code.get("git") or {}
    dirty = any(commit.endswith("(dirty)") for commit in comparison.run_commits)
    lines = [f"# Reproduction of `{comparison.reference}` by `{comparison.run}`", "", f"**{comparison.verdict}**", "",
             f"- this run's cells: code version(s) {', '.join(comparison.run_code_versions) or '(none)'}; "
             f"commit(s) {', '.join(comparison.run_commits) or '(none)'}"
             + (" **(dirty tree: not reproducible from a commit; never commit these cells)**" if dirty else ""),
             f"- reference: code version(s) {', '.join(comparison.reference_code_versions)}; "
             f"commit(s) {', '.join(comparison.reference_commits)}",
             f"- compared by code version {comparison.run_code.get('code_version')}, commit {git.get('commit')}"
             + (" (dirty)" if git.get("dirty") else ""), ""]
    for model, (reference, run) in sorted(comparison.selections.items()):
        same = "same" if reference == run else "**differ**"
        lines.append(f"- RWKU targets chosen for {model} (`select_known`): reference {reference}, this run {run} "
                     f"({same})")
    if comparison.selections:
        lines.append("")
    named, counts = _per_side(comparison.cells, lambda c, side: c.threads[side], "torch threads", "not recorded")
    lines += named
    if len(counts) > 1 and not counts <= set(MEASURED_THREADS):
        lines.append(f"- **the runs used different thread counts ({', '.join(map(str, sorted(counts)))})**: the cross-thread "
                     f"bound was measured at {' and '.join(map(str, MEASURED_THREADS))} threads; at other counts MKL "
                     "may block matrix products differently again")
    cpu_cells = [c for c in comparison.cells if (c.device or "cpu") == "cpu"]
    named, sets = _per_side(cpu_cells, lambda c, side: c.cpus[side], "CPU instruction set", None)
    lines += named
    if len(sets) > 1:   # measured: the forget01 fine-tune's weights differ between AVX2 and AVX-512 machines
        lines.append(f"- **the runs' CPUs use different instruction sets ({', '.join(sorted(sets))})**: float32 "
                     "results are exact only on the same one (docs/reproducibility.md), so differences in the last "
                     "digits here may be the CPU's")
    lines.append("")
    devices = sorted({c.device or "cpu" for c in comparison.cells})
    lines += ["## Tolerances", "", "| numbers | device | tolerance (absolute) | why |", "|---|---|---|---|"]
    for device in devices:
        if device == "cpu":
            lines.append(f"| every metric, failure class and gate mean, same thread count | cpu | 0 (exact) | "
                         f"{EXACT.why} |")
            if any(cross_thread(c.threads) for c in comparison.cells if (c.device or "cpu") == "cpu"):
                lines.append(f"| the same, different thread counts | cpu | {CROSS_THREAD.absolute:g} | "
                             f"{CROSS_THREAD.why} |")
        else:
            lines += [f"| `{pattern}` | {device} | {tol.absolute:g} | {tol.why} |" for pattern, tol in GPU_TOLERANCES]
    lines += ["", "## Cells", "", "| cell | hash | result | numbers | beyond tolerance | inputs that differ |",
              "|---|---|---|---|---|---|"]
    for c in comparison.cells:
        inputs = ", ".join(c.inputs_differ) or "none"
        if c.reference_dirty:
            inputs += " (reference from a dirty tree)"
        lines.append(f"| {_cell(c.cell)} | {c.hash} | {c.status} | {c.n_numbers} | {len(c.diffs)} | {inputs} |")
    diffs = [d for c in comparison.cells for d in c.diffs]
    if diffs:
        lines += ["", "## Numbers beyond tolerance", "", "| cell | number | reference | this run | Δ | tolerance |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {_cell(d.cell)} | {d.name} | {_fmt(d.reference)} | {_fmt(d.value)} | {_fmt(d.delta)} | "
                  f"{d.tolerance:g} |" for d in diffs]
    if comparison.extra:
        lines += ["", "## Cells of this run the reference does not have", ""] + [f"- {e}" for e in comparison.extra]
    lines += ["", "Cells are paired by the hash of their resolved config. \"inputs that differ\": the saved code "
              "version, model/data fingerprints, library versions or Hub revisions of the reference cell differ "
              "from this run's (runner.provenance); a reference computed by other code is stale and should be "
              "regenerated.", ""]
    return "\n".join(lines)


def write_reproduction(run_dir: str | Path, reference_dir: str | Path, *, log=print,
                       out_dir: str | Path | None = None) -> Comparison:
    """Compare, write `reproduction.md` and `reproduction.json` into `out_dir` (default: `run_dir`, the run's own),
    log the verdict line. A run directory that cannot be written (read-only) still gets its verdict, with a line
    saying where the details could not go."""
    from ..errors import OutputWriteError
    from ..locations import make_files_dir, output_lock

    comparison = compare_runs(run_dir, reference_dir)
    target = Path(out_dir) if out_dir is not None else Path(run_dir)
    try:
        with output_lock(target / REPORT_FILE, "the comparison"):
            if out_dir is not None:
                make_files_dir(target)
            atomic_write_text(target / REPORT_FILE, comparison_markdown(comparison))
            atomic_write_json(target / JSON_FILE, comparison.to_dict())
    except OSError as err:
        from ..errors import WRITE_ERRNOS

        if out_dir is not None or not (isinstance(err, OutputWriteError) or err.errno in WRITE_ERRNOS):
            raise
        log(f"{comparison.verdict} (details not written: {err}; give --out DIR to write them elsewhere)")
        return comparison
    log(f"{comparison.verdict} (details: {target / REPORT_FILE})")
    return comparison
