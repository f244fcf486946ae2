"""One worker of a multi-session CPU campaign (see README.md beside this file).

Several workers share one output directory. Each takes the next cell of a fixed order that nobody computes yet:
the fine-tune, the oracle, the Original, then per seed and per method the method cell followed by its attack
cells, so that a method's attacks run in the session that trained its model (a new session has no models). A
finished cell whose model a later cell needs but which is not on this machine (landed by an earlier session) is
computed again first, and its numbers are compared with the landed ones (`recomputed.jsonl`). No cell is started
that would not end before the deadline, and a method cell only when its attacks would end too, unless nothing else
can start: some of its attacks still fit then, and the next session makes its model again for the rest.

    python worker.py CONFIG OUTPUT_DIR --deadline 2026-11-27T23:15 [--order CRU,GA,...]

A config with `tuning:` is computed as `cru-harness run` computes it: its validation cells first (the run's
fine-tune, the validation oracle and Original, one cell per setting), and once every one has a result the rule's
choice (saved as `run` saves it, `tuning/<model>.json`) and the reported cells at the chosen settings. Cells that
do not depend on the choice (the reported oracle and Original, untuned methods) come after the validation cells.

Run it with the campaign's pinned checkout on the path (its venv), from that checkout's root.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

from cru_harness.reporting.tuning import TUNING_DIR
from cru_harness.runner.execute import PlanExecutor
from cru_harness.runner.loop import run_cells
from cru_harness.runner.plan import attacked_cell_for, build_plan, retain_cell_for
from cru_harness.runner.provenance import cell_inputs, key_libraries, stale_fields
from cru_harness.runner.tuning import apply, decide, load_with_tuning, validation_cells
from cru_harness.store import CellStore, atomic_write_json, waiting_lock

# Minutes one cell takes on one thread of the 2-core CPU (forget01 at limit 40), rounded up from the campaign's
# own cells (2026-11-27: fine-tune 3.8, oracle 11.6, Original 6.3, GA 7.0, CRU 8.9, quantize and relearn 6-9,
# in_context 5.7, paraphrase 2.0, detach 6.5).
MINUTES = {"finetune": 5, "retain": 13, "original": 8, "method": 12, "heavy_attack": 10, "prompt_attack": 7}
PROMPT_ATTACKS = ("in_context", "paraphrase", "detach")


def minutes(cell) -> float:
    if cell.kind == "attack":
        name = cell.extra["attack"]["name"]
        return MINUTES["prompt_attack" if name in PROMPT_ATTACKS else "heavy_attack"]
    return MINUTES.get(cell.kind, 20)


def attacks_by_cell(cells) -> dict[str, list]:
    """Each attacked cell's hash -> its attack cells, in plan order."""
    attacks: dict[str, list] = {}
    for cell in cells:
        if cell.kind == "attack":
            attacks.setdefault(cell.extra["attacked"], []).append(cell)
    return attacks


def ordered(cells, methods: list[str], attacks: dict[str, list]) -> list:
    """The fine-tune, the oracle, the Original, the oracle's attacks (the control); then seed by seed, method by
    method, each method cell followed by its attacks (`attacks_by_cell`)."""
    by_hash = {c.hash: c for c in cells}
    head = [c for kind in ("finetune", "retain", "original") for c in cells if c.kind == kind]
    out = list(head)
    for c in head:
        out += attacks.get(c.hash, [])
    rank = {label: i for i, label in enumerate(methods)}
    # a tuned config's validation cell is labelled "<entry> [<setting>]" (`runner.tuning.setting_label`): its entry's
    # rank
    method_cells = sorted((c for c in cells if c.kind == "method"),
                          key=lambda c: (c.seed or 0, rank.get(c.label.split(" [", 1)[0], len(rank)), c.label))
    for c in method_cells:
        out += [c] + attacks.get(c.hash, [])
    assert sorted(x.hash for x in out) == sorted(by_hash), "the order must hold every planned cell once"
    return out


def campaign_cells(config, load) -> tuple[list, list, dict | None]:
    """(validation cells, reported cells, tuning record) of a config as `cru-harness run` plans it: without
    `tuning:`, no validation cells and the whole plan; with it, the validation cells (the run's fine-tune first),
    and the plan with each tuned entry at the rule's choice, or left out while a validation cell has no result
    (`load(hash)`: a finished cell's result, else None)."""
    if config.tuning is None:
        return [], build_plan(config), None
    tuned = config.tuning.settings
    untuned = dataclasses.replace(config, methods=tuple(m for m in config.methods if m.label not in tuned))
    validation = validation_cells(config, [c for c in build_plan(untuned) if c.kind == "finetune"])
    record = decide(config, validation, load)
    return validation, build_plan(apply(config, record)), record


def campaign_plan(validation, cells) -> list:
    """Every cell of the campaign once: the validation cells, then the plan (the fine-tune is in both)."""
    own = {c.hash for c in validation}
    return [*validation, *(c for c in cells if c.hash not in own)]


def campaign_order(validation, cells, methods: list[str]) -> list:
    """The validation cells first (`ordered`), then the rest of the plan (`ordered`), each cell once."""
    first = ordered(validation, methods, {}) if validation else []
    seen = {c.hash for c in first}
    rest = ordered(cells, methods, attacks_by_cell(cells))
    return first + [c for c in rest if c.hash not in seen]


def model_on_disk(result: dict | None, root: Path, cell_hash: str) -> bool:
    """The deployed model of a finished cell is on this machine: its weights and, for CRU, its router bundle, where
    the cell wrote them into its own work directory, `cells/<hash>/`, under `root` or under the run directory of
    another config with the same cells (the tuned run's cells land in the tuned robustness run too); other paths
    are the base model."""
    artifacts = (result or {}).get("artifacts") or {}
    paths = [Path(artifacts[key]) for key in ("model", "routers") if artifacts.get(key)]
    own = [p for p in paths if p.resolve().is_relative_to(root.resolve())
           or any(a == "cells" and b == cell_hash for a, b in zip(p.parts, p.parts[1:]))]
    return all(p.exists() for p in own)


class Worker:
    def __init__(self, config_path: str, output_dir: str, deadline: dt.datetime, methods: list[str]):
        self.config = load_with_tuning(config_path, {"output_dir": output_dir})
        self.methods = methods
        self.root = Path(output_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.store = CellStore(output_dir, log=self.log)
        self.deadline = deadline
        self.done_this_session: set[str] = set()   # computed here: their models are on this machine
        self.inputs: dict[str, dict] = {}
        self.plan()

    def plan(self) -> bool:
        """Plan (again) what to compute; True when a tuned config's rule has chosen (its reported cells planned)."""
        validation, cells, record = campaign_cells(self.config, lambda h: self.store.load_result(h, quiet=True))
        if record is not None:   # as `cru-harness run` saves it (its report's "Tuning" section reads it)
            atomic_write_json(self.root / TUNING_DIR / f"{record['model']}.json", record)
        self.choosing = self.config.tuning is not None and record is None
        self.cells = campaign_plan(validation, cells)
        self.attacks = attacks_by_cell(self.cells)
        self.order = campaign_order(validation, cells, self.methods)
        self.executor = PlanExecutor(self.store, self.cells, log=self.log)
        return self.config.tuning is not None and record is not None

    def log(self, message: str) -> None:
        """To stdout, and one line per event to the run directory's campaign.log: the workers' own logs interleave
        these lines with progress bars."""
        line = f"[{dt.datetime.now():%H:%M:%S} pid {os.getpid()}] {message}"
        print(line, flush=True)
        with open(self.root / "campaign.log", "a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    def current(self, cell) -> bool:
        """Finished, by this code and with these inputs."""
        if not self.store.is_finished(cell.hash):
            return False
        if cell.hash not in self.inputs:   # fingerprints the model directories: once per cell
            self.inputs[cell.hash] = cell_inputs(cell)
        return not stale_fields(self.store.load_record(cell.hash), self.inputs[cell.hash])

    def fits(self, cell, extra: float = 0.0) -> bool:
        return dt.datetime.now() + dt.timedelta(minutes=minutes(cell) + extra) <= self.deadline

    def needs_model(self, owner) -> bool:
        """The owner's model is needed but not here: it was finished by an earlier session."""
        result = self.store.load_result(owner.hash)
        return (self.current(owner) and owner.hash not in self.done_this_session
                and not model_on_disk(result, self.root, owner.hash))

    def pick(self):
        """(cell, force) to compute next; "wait" while the only cells left wait on cells being computed; None when
        nothing more can start before the deadline. Called under the queue lock."""
        waiting, fallback = False, None
        for cell in self.order:
            if self.current(cell) or self.store.running_elsewhere(cell.hash):
                continue
            if cell.hash in self.done_this_session:
                continue   # it failed here: once is enough (the log and its result say why), not a retry loop
            deps = [d for d in (attacked_cell_for(cell, self.cells), retain_cell_for(cell, self.cells))
                    if d is not None and d.hash != cell.hash]
            if any(self.store.running_elsewhere(d.hash) for d in deps):
                waiting = True   # its model is being made: take a later cell meanwhile
                continue
            if any(not self.current(d) for d in deps):
                continue   # comes after its dependency in the order, which failed or does not fit
            missing = [d for d in deps if self.needs_model(d)]
            if missing:   # landed by an earlier session: make its model again first
                return (missing[0], True) if self.fits(missing[0]) else None
            if cell.kind == "method":   # start a method only when its attacks can end today, two workers sharing
                share = sum(minutes(c) for c in self.attacks.get(cell.hash, [])) / 2
                if not self.fits(cell, share):
                    if fallback is None and self.fits(cell):
                        fallback = (cell, False)
                    continue
            elif not self.fits(cell):
                continue
            return cell, False
        if fallback is not None:   # late in the session: some of its attacks fit, better than an idle core
            return fallback
        return "wait" if waiting else None

    def run(self) -> None:
        while True:
            with waiting_lock(self.root / ".campaign-queue.lock"):
                picked = self.pick()
                if picked not in (None, "wait"):
                    cell, force = picked
                    previous = self.store.load_result(cell.hash) if force else None
                    self.store.mark_running(cell.hash)   # the other workers' sign that it is taken
            if picked is None and self.choosing:   # the validation cells' turn is over: the rule chooses
                if self.plan():
                    self.log("tuning: the rule chose; the reported cells are planned at its choice")
                    continue
                if any(self.store.running_elsewhere(c.hash) for c in self.cells):
                    picked = "wait"   # another worker computes a validation cell the choice waits on
            if picked is None:
                break
            if picked == "wait":
                time.sleep(30)
                continue
            self.log(f"start {cell.hash} {cell.describe()}{' (again, for its model)' if force else ''}")
            run_cells([cell], self.store, self.executor, log=self.log, force=force, inputs=cell_inputs)
            self.done_this_session.add(cell.hash)
            if previous is not None:
                self.compare(cell, previous)
            if self.choosing and self.plan():   # that was the last validation cell: the choice is saved and planned
                self.log("tuning: the rule chose; the reported cells are planned at its choice")
        self.log("nothing more to start before the deadline")

    def compare(self, cell, previous: dict) -> None:
        """A cell recomputed for its model: its numbers against the landed ones (equal on one CPU)."""
        now = self.store.load_result(cell.hash) or {}
        old, new = previous.get("metrics") or {}, now.get("metrics") or {}
        differ = {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}
        line = {"hash": cell.hash, "cell": cell.describe(), "status": now.get("status"), "differ": differ}
        with open(self.root / "recomputed.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
        self.log(f"recomputed {cell.hash}: {'same numbers' if not differ else f'{len(differ)} metrics differ'}")


def library_drift(root: Path) -> dict[str, tuple[list[str], str | None]]:
    """Library -> (the versions finished cells under `root` recorded, this environment's), for each library where
    they differ: every such cell counts as stale (`stale_fields`, "libraries"), so a worker would compute it again."""
    current, recorded = key_libraries(), {}
    for path in sorted((root / "cells").glob("*/run_record.json")):
        if not (path.parent / "result.json").is_file():
            continue
        saved = (json.loads(path.read_text(encoding="utf-8")).get("inputs") or {}).get("libraries") or {}
        for name, version in saved.items():
            if version != current.get(name):
                recorded.setdefault(name, set()).add(str(version))
    return {name: (sorted(versions), current.get(name)) for name, versions in sorted(recorded.items())}


def drift_message(root: Path, drift: dict) -> str:
    """One line: which libraries differ and the pip command that restores them."""
    names = "; ".join(f"{name} {' or '.join(was)} (here {now})" for name, (was, now) in drift.items())
    pins = " ".join(f"{name}=={was[0]}" for name, (was, _) in drift.items() if name != "python" and len(was) == 1)
    fix = f"pip install {pins}" if pins else "install the recorded versions"
    return (f"{root}: the landed cells were computed with other library versions ({names}), so every one would be "
            f"computed again; {fix}, then start again")


def main(argv=None) -> int:
    import torch

    # A landed cell made again in a later session must give the same numbers: on a CPU they change with the thread
    # count (the sums' order), so every worker of every session runs one thread.
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("output_dir")
    parser.add_argument("--deadline", help="local time, ISO (2026-11-27T23:15); required unless --check")
    parser.add_argument("--check", action="store_true",
                        help="only check that this environment's libraries are those the landed cells recorded")
    parser.add_argument("--order", default="CRU,GA,NPO,GD,SimNPO,IdkDPO,GD-KL,NPO-KL,DPO,RT,RMU,UNDIAL,SatImp,"
                                           "WGA,CE-U,TaskVector,WHP,LUNAR",
                        help="method labels, in the order their cells run within a seed")
    args = parser.parse_args(argv)
    if args.check:
        drift = library_drift(Path(args.output_dir))
        if drift:
            print(drift_message(Path(args.output_dir), drift), file=sys.stderr)
            return 4
        return 0
    if args.deadline is None:
        parser.error("--deadline is required")
    Worker(args.config, args.output_dir, dt.datetime.fromisoformat(args.deadline), args.order.split(",")).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
