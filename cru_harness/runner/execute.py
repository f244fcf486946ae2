"""The real executor of a cell: train (CRU, a baseline, or a retain oracle: `runner.training`), evaluate with
lm-eval and the `cru` model (`runner.evaluation`), then score. Models and devices come from `runner.models`;
the loop that calls an executor per cell is `runner.loop`.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from .. import plugins
from ..errors import MissingInputError
from ..metrics.recovery import taught_questions
from ..store import CellStore, waiting_lock
from .evaluation import cell_lens, evaluate_cell, score_cell
from .prompting import CellDecisions
from .models import resolve_data_dir, resolve_model_path
from .plan import Cell, settle
from .provenance import directory_fingerprint
from .training import FINETUNED_DIR, train_finetuned_model, train_retain_model

REFINETUNE_LOCK = "refinetune.lock"   # both under the finetune cell's work dir
REFINETUNE_STAGING = "refinetune"


class PlanExecutor:
    """The real executor for one plan: `execute_cell` with what a cell needs from other cells of the run.

    A TOFU method/original cell's Forget Quality compares its per-item forget truth ratios with those of the
    retain cell of the same model and split (`plan.retain_cell_for`); the plan runs that cell first, and its
    finished result is read from the store; while another shard computes it, the cell waits. When it is missing
    or failed, Forget Quality stays null here, privleak falls back to open-unlearning's 0.5, and the report fills
    both once the retain cell exists (`reporting.tables.fill_from_oracle`); the privacy task's reference attack
    (the oracle as reference model) is then not run.
    """

    def __init__(self, store: CellStore, cells: Iterable[Cell], log: Callable[[str], None] | None = None):
        self.store = store
        cells = list(cells)
        # the plan's cells carry the cells each reads (`plan.settle`); cells listed otherwise are settled here
        self.cells = cells if all(c.decisions.linked for c in cells) else settle(cells)
        self.by_hash = {c.hash: c for c in self.cells}
        self.log = log

    def planned(self, cell: Cell) -> Cell:
        """`cell` as the plan settled it: with its decisions, and the hashes of the cells it reads."""
        return cell if cell.decisions.linked else self.by_hash.get(cell.hash, cell)

    def read(self, what: str | None) -> Cell | None:
        """The cell of this plan with hash `what` (None when it is not in the plan)."""
        return self.by_hash.get(what) if what is not None else None

    def finetuned_checkpoint(self, cell: Cell, source: Cell) -> tuple[str, dict]:
        """The checkpoint `cell` starts from, written by the finetune cell `source`, and where it came from.

        A finished finetune cell whose checkpoint is not on this machine (the run began on another machine or
        GPU lease, a shard ran elsewhere, work/ was cleaned) is fine-tuned again, same recipe and seed, into its
        own work directory, which later cells and runs reuse. Its weights' fingerprint is compared with the one
        the cell recorded: equal on the CPU; a GPU's kernels need not be bitwise deterministic, and cells that
        start from a differing checkpoint say so (`details.finetuned_from`, a note in the report)."""
        loaded = self.store.load_result(source.hash)
        if not loaded:   # another shard of the run may be fine-tuning it: its cells wait, as attack cells do
            loaded = self.store.wait_while_running_elsewhere(source.hash, log=self.log)
        if not loaded or loaded.get("status") != "ok":
            state = "has not run" if not loaded else f"is {loaded.get('status')}"
            raise RuntimeError(f"model {cell.model.name} starts from its fine-tuned checkpoint, but its finetune "
                               f"cell {source.hash} {state} (with --shard: run the shard holding it first)")
        recorded = ((loaded.get("details") or {}).get("finetune") or {}).get("checkpoint_fingerprint")
        checkpoint = Path((loaded.get("artifacts") or {}).get("checkpoint") or "")
        again = False
        if not (checkpoint.name and checkpoint.is_dir()):
            workdir = self.store.work_dir(source.hash)
            checkpoint = workdir / FINETUNED_DIR
            # Shards of one run on one machine may all miss it at once: one fine-tunes, the others wait and reuse
            # it. It is written beside its place and moved there whole, so that a killed re-run leaves no
            # half-written checkpoint for a later cell to take as the real one.
            with waiting_lock(workdir / REFINETUNE_LOCK):   # in work/: never part of the results
                if not checkpoint.is_dir():  # not fine-tuned again by an earlier cell, run or shard here either
                    print(f"{source.hash}: the fine-tuned checkpoint of model {cell.model.name} is not on this "
                          "machine; fine-tuning it again with the same recipe and seed", flush=True)
                    staging = workdir / REFINETUNE_STAGING
                    if staging.exists():    # left by a killed re-run
                        shutil.rmtree(staging)
                    made = Path(execute_cell(source, staging)["artifacts"]["checkpoint"])
                    os.replace(made, checkpoint)
                    shutil.rmtree(staging)
                    again = True
        fingerprint = directory_fingerprint(checkpoint)
        return str(checkpoint), {"cell": source.hash, "fine_tuned_again": again, "checkpoint_fingerprint": fingerprint,
                                 "recorded_fingerprint": recorded,
                                 "matches_recorded": None if recorded is None else fingerprint == recorded}

    def __call__(self, cell: Cell, workdir: Path) -> dict:
        cell = self.planned(cell)
        decisions = cell.decisions
        base_path, finetuned_from = None, None
        source = self.read(decisions.starts_from)
        if decisions.starts_from is not None and source is None:   # never the base model in its place
            raise RuntimeError(f"cell {cell.hash} starts from the fine-tune cell {decisions.starts_from}, which is not "
                               "in the plan this executor was given")
        if source is not None:
            base_path, finetuned_from = self.finetuned_checkpoint(cell, source)
        retain_result = None
        retain = self.read(decisions.oracle)   # None unless the benchmark has an oracle (and never for the oracle)
        if retain is not None:
            loaded = self.store.load_result(retain.hash)
            if not loaded:   # another shard may be computing the oracle: wait, as for a fine-tune (its
                # reference attack cannot be run later, as Forget Quality and privleak can be filled)
                loaded = self.store.wait_while_running_elsewhere(retain.hash, log=self.log)
            if loaded and loaded.get("status") == "ok":
                retain_result = loaded
            elif self.log is not None:
                self.log(f"{cell.hash}: its retain cell {retain.hash} has no result: Forget Quality and privleak "
                         "are filled by the report once it exists; the privacy task's reference attack is not run")
        if cell.kind == "method" and cell.extra.get("continues"):   # a sequel: starts from the previous cell's model
            base_path = self.continued_model(cell)
        attacked = None
        if cell.kind == "attack":
            target = self.read(cell.extra["attacked"])
            attacked = self.store.load_result(target.hash) if target is not None else None
            if target is not None and not attacked:   # another shard of the run may be computing it
                attacked = self.store.wait_while_running_elsewhere(target.hash, log=self.log)
            if not attacked or attacked.get("status") != "ok":
                state = "is not in this plan" if target is None else (
                    "has not run" if not attacked else f"is {attacked.get('status')}")
                raise RuntimeError(f"attack cell {cell.hash}: the cell it attacks ({cell.extra['attacked']}) {state}")
        outcome = execute_cell(cell, workdir, retain_result=retain_result, base_path=base_path,
                               attacked_result=attacked)
        if finetuned_from is not None:
            outcome.setdefault("details", {})["finetuned_from"] = finetuned_from
        if cell.kind == "method" and cell.extra.get("continues"):
            outcome.setdefault("details", {})["started_from"] = base_path
        return outcome

    def continued_model(self, cell: Cell) -> str:
        """The model a sequel cell starts from: the finished previous cell's (`plan.continued_cell_for`), one
        checkpoint on this machine."""
        previous = self.read(cell.extra["continues"])
        loaded = self.store.load_result(previous.hash) if previous is not None else None
        if previous is not None and not loaded:   # another shard may be computing it
            loaded = self.store.wait_while_running_elsewhere(previous.hash, log=self.log)
        if not loaded or loaded.get("status") != "ok":
            state = "is not in this plan" if previous is None else (
                "has not run" if not loaded else f"is {loaded.get('status')}")
            raise RuntimeError(f"{cell.hash}: the cell it continues ({cell.extra['continues']}) {state}")
        artifacts = loaded.get("artifacts") or {}
        model = artifacts.get("model")
        method = self.planned(cell).decisions.method
        if artifacts.get("routers") or not model or not Path(model).is_dir() or \
                (method is not None and not method.one_checkpoint):
            raise MissingInputError(f"{cell.describe()}: the cell it continues left no one checkpoint on this "
                                    f"machine to start from ({model}; routers: {artifacts.get('routers')})")
        return model


def attacked_model(result: dict | None, base_path: str) -> tuple[str, str | None]:
    """The deployed model of a finished method cell: its trained weights (or the base) and its router bundle."""
    if result is None:
        raise ValueError("an attack cell needs the finished result of the cell it attacks")
    artifacts = result.get("artifacts") or {}
    model, routers = artifacts.get("model") or base_path, artifacts.get("routers")
    for what, path in (("model", model), ("routers", routers)):
        if path and Path(path).is_absolute() and not Path(path).exists():
            raise MissingInputError(f"the attacked cell's {what} is not on this machine ({path}): run that cell "
                                    "again here (`run --force --only` its label) before attacking it")
    return model, routers


def method_context(cell: Cell, model_path: str, workdir: Path, data_dir, outcome: dict, *,
                   trains: bool | None = None):
    """What a method plugin's (or an attack's) `run` receives (`cru_harness.api.CellContext`): rows are written as
    the cell's evaluation shows them (chat template or plain), models load as its decisions say."""
    from ..api import CellContext

    decisions = cell.decisions
    # a method that trains nothing (prompt-only, published checkpoints) reads nothing of the base model here
    trains = decisions.method.trains if trains is None else trains
    chat = decisions.chat(model_path) if trains else False
    return CellContext(cell=cell, model_path=model_path, workdir=workdir, data_dir=data_dir, outcome=outcome,
                       chat=chat, prompt_format=decisions.rows(chat) if trains else {},
                       dtype=decisions.dtype() if trains else "auto",
                       load_model=decisions.load_model, device=decisions.device)


def privacy_reference(decisions: CellDecisions, retain_result: dict | None, outcome: dict) -> str | None:
    """The reference model of a task's reference attack (TOFU's privacy tasks): the cell's retain oracle
    (open-unlearning's TOFU config names the retain model), when the cell runs such a task
    (`CellDecisions.oracle_reference`) and the oracle's checkpoint is on this machine. Recorded in
    `details.privacy_reference` either way, so a missing AUC says why."""
    if not decisions.oracle_reference:
        return None
    path = ((retain_result or {}).get("artifacts") or {}).get("model")
    if path and Path(path).is_dir():
        outcome["details"]["privacy_reference"] = {"model": path, "source": f"retain cell {retain_result.get('hash')}"}
        return path
    outcome["details"]["privacy_reference"] = {
        "model": None, "reason": "no retain cell checkpoint on this machine: the reference attack was not run"}
    return None


def execute_cell(cell: Cell, workdir: Path, *, retain_result: dict | None = None,
                 base_path: str | None = None, attacked_result: dict | None = None) -> dict:
    """Train (if the cell's method trains), evaluate with lm-eval + the `cru` model, score. See module doc.

    `retain_result`: the finished retain cell of a TOFU cell (its per-item truth ratios give Forget Quality).
    `base_path`: the model the cell starts from when it is not `cell.model.path` (its fine-tuned checkpoint).
    A `finetune` cell only trains: its checkpoint is the artifact the model's other cells start from.
    Everything decided about the cell is read from its decisions (`runner.prompting.CellDecisions`), which the
    plan settled (a cell built by hand is decided once, when first asked).
    """
    decisions = cell.decisions   # what training, evaluation and scoring read from here on
    data_dir = resolve_data_dir(cell.data_dir)
    outcome: dict[str, Any] = {"resources": {}, "details": {}, "artifacts": {}}
    given_path = resolve_model_path(cell.model.path)
    if cell.kind == "finetune":
        train_finetuned_model(cell, cell.extra.get("finetune", cell.hparams), given_path,
                              cell.corpora["train_corpus"], workdir, data_dir, outcome)
        return outcome
    benchmark = plugins.benchmarks.get(cell.benchmark)
    if cell.kind == "retain" and cell.extra["retain"]["kind"] == "per_item":
        return benchmark.oracle_from_file(cell.extra["retain"]["value"], cell)
    # the tasks its benchmark's data can serve (RWKU's utility sets exist for some targets only), before it trains
    tasks, unavailable = benchmark.tasks_with_data(cell, data_dir)
    base_path = base_path or given_path
    model_path = base_path
    routers = None
    task_metadata = None   # an attack's on the prompts: what its task variants read
    same_model = False     # an attack that serves the attacked cell's model as it is (on other prompts)

    if cell.kind == "retain":
        retain = cell.extra["retain"]
        if retain["kind"] == "checkpoint":
            model_path = resolve_model_path(retain["value"])
        elif retain["kind"] == "finetune":  # the oracle: the same recipe from the same starting model
            model_path = train_finetuned_model(cell, retain["value"], given_path, cell.corpora["retain_corpus"],
                                               workdir, data_dir, outcome, name="retain_model")
        else:
            model_path = train_retain_model(cell, retain["value"], workdir, data_dir, outcome)
        outcome["artifacts"]["model"] = model_path   # what an attack on the oracle (the control) starts from
    elif cell.kind == "method":   # the method's plugin trains (or fetches) what the evaluation loads
        from ..plugins import check_trained

        trained = check_trained(decisions.method.run(method_context(cell, model_path, workdir, data_dir, outcome)),
                                decisions.method, "method")
        model_path, routers = trained.model_path, trained.routers
        outcome["artifacts"]["model"] = model_path   # what an attack on this cell starts from
    elif cell.kind == "attack":
        model_path, routers = attacked_model(attacked_result, base_path)
        ctx = method_context(cell, model_path, workdir, data_dir, outcome, trains=True)
        ctx.routers = routers
        ctx.base_path = base_path   # the quantize attack's noise floor compares the unlearning's change with it
        attack = plugins.attacks.get(cell.extra["attack"]["name"])
        from ..plugins import check_trained

        attacked = check_trained(attack.run(ctx), attack, "attack")
        same_model = (attacked.model_path, attacked.routers) == (model_path, routers)   # a prompt attack
        model_path, routers = attacked.model_path, attacked.routers
        task_metadata = benchmark.variant_metadata(
            getattr(attack, "variant", attack.name), attack.task_metadata(cell.extra["attack"]["settings"], cell.seed)
        ) or None
        label = attacked_result["label"]
        outcome["details"]["attack"] = {**cell.extra["attack"], "attacked": cell.extra["attacked"],
                                        "attacked_label": label, "attacked_kind": attacked_result.get("kind"),
                                        "attack_label": cell.label.removeprefix(f"{label} + "),
                                        **({"task_metadata": task_metadata} if task_metadata else {})}
    chat = decisions.chat(model_path)
    outcome["details"]["prompting"] = {"apply_chat_template": chat, "presets": dict(decisions.presets)}
    reference = privacy_reference(decisions, retain_result, outcome)
    evaluation = evaluate_cell(cell, model_path, routers, workdir, data_dir, chat, reference=reference,
                               metadata=task_metadata, tasks=(tasks, unavailable))
    outcome["artifacts"].update(evaluation["artifacts"])
    outcome["resources"]["eval_wall_time_s"] = evaluation["wall_time_s"]
    if evaluation["tasks_unavailable"]:
        outcome["details"]["tasks_unavailable"] = evaluation["tasks_unavailable"]
    # Failure classes: each answer's NLL under the original model = the cell's base model (for CRU the same
    # checkpoint with its routers detached, i.e. loaded without them).
    t0 = time.perf_counter()
    scored = score_cell(cell, evaluation["output_dir"], data_dir=data_dir, original_model=base_path,
                        retain_result=retain_result)
    outcome["resources"]["score_wall_time_s"] = time.perf_counter() - t0
    outcome.update(metrics=scored["metrics"], per_item=scored.get("per_item", {}),
                   failure_classes=scored.get("failure_classes", {}))
    outcome["artifacts"].update(scored.get("artifacts", {}))
    outcome["details"]["scoring"] = {**scored.get("details", {}), "nll_original_model": base_path}
    if cell.evaluation.get("logit_lens"):   # asked for by the run: the answer read at every layer
        lens = cell_lens(cell, model_path, routers, data_dir, chat,
                         attacked_result if same_model else None, taught=taught_questions(outcome))
        if lens is not None:
            if "best" in lens:
                outcome["metrics"]["forget_best_layer_prob"] = lens["best"]
            outcome["details"]["logit_lens"] = lens
    return outcome
