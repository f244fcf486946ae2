"""RWKU (Jin et al. 2024): real-world people as unlearning targets. A cell's unit is one target; lm-eval tasks in
its `tasks/`; scored by `scoring.score_rwku_cell` (the tasks' `per_target_results`)."""
from __future__ import annotations

from typing import Any

from pathlib import Path

from ...api import Benchmark
from .data import DEFAULT_TARGETS, SOURCE, TargetSelectionError, parse_targets
from ...hparams import MAX_ROWS
from .prompts import DEFAULT_RWKU_PRESET
from ...reporting import stats
from ...reporting.tables import Column, fc_columns

SELECT_KEYS = ("top", "probes", "rows")
#: Forget probes whose score on the original model says how well it knows a target (RWKU ROUGE-L recall).
SELECT_PROBES = ("rwku_fb", "rwku_qa", "rwku_aa")


RWKU_COLUMNS = [
    Column("forget_fb", "Forget FB ↓", "FB$\\downarrow$", "down", "Forget"),
    Column("forget_qa", "Forget QA ↓", "QA$\\downarrow$", "down", "Forget"),
    Column("forget_aa", "Forget AA ↓", "AA$\\downarrow$", "down", "Forget"),
    Column("forget_all", "Forget All ↓", "All$\\downarrow$", "down", "Forget"),
    *fc_columns("forget"),
    Column("neighbor_fb", "Neighbor FB ↑", "FB$\\uparrow$", "up", "Neighbor"),
    Column("neighbor_qa", "Neighbor QA ↑", "QA$\\uparrow$", "up", "Neighbor"),
    # LOSS score = mean token log-likelihood (metrics.mia.loss_score): forgetting pushes it *down* on FM texts.
    Column("mia_fm", "MIA FM log-lik. ↓", "FM log-lik.$\\downarrow$", "down", "MIA"),
    Column("mia_rm", "MIA RM log-lik.", "RM log-lik.", None, "MIA"),
    Column("mia_auc", "MIA AUC →0.5", "AUC$\\to$0.5", "half", "MIA"),
    Column("utility_mmlu", "MMLU ↑", "Gen.$\\uparrow$", "up", "Utility"),
    Column("utility_bbh", "BBH ↑", "Rea.$\\uparrow$", "up", "Utility"),
    Column("utility_truthfulqa", "TruthfulQA ↑", "Tru.$\\uparrow$", "up", "Utility"),
    Column("utility_triviaqa", "TriviaQA ↑", "Fac.$\\uparrow$", "up", "Utility"),
    Column("utility_fluency", "Fluency ↑", "Flu.$\\uparrow$", "up", "Utility"),
]


def rwku_forget_all(result: dict, metrics: dict) -> float | None:
    """RWKU's forget "All" of one cell (one target): the mean over the target's FB, QA and AA items together,
    i.e. FB, QA and AA weighted by their item counts, as the All of RWKU's paper (its tables' All is the
    count-weighted mean of its FB / QA / AA columns, not their plain mean). The counts are the per-target `n`
    the scorer recorded (`details.scoring.per_target`) for the cell's target (every target's, for a result without
    one). A cell lacking FB, QA or AA, or a count, gives None: an "All" of what is there would be another number."""
    per_target = ((result.get("details") or {}).get("scoring") or {}).get("per_target") or {}
    target = result.get("target")
    total = weight = 0.0
    for probe in ("fb", "qa", "aa"):
        value = metrics.get(f"forget_{probe}")
        rows = per_target.get(f"rwku_{probe}") or per_target.get(f"rwku_icu_{probe}") or {}
        if target is not None:
            rows = {key: row for key, row in rows.items() if str(key) == str(target)}
        count = sum(row.get("n") or 0 for row in rows.values())
        if not stats.is_number(value) or not count:
            return None
        total, weight = total + value * count, weight + count
    return total / weight


class RWKU(Benchmark):
    name = "rwku"
    summary = "RWKU: 200 real-world targets; forget / neighbour probes, MIA and utility per target"
    unit = "target"
    config_keys = ("targets", "select_known", "tasks", "limit", "forget_corpus", "retain_corpus", "data_dir")
    default_tasks = ("rwku_forget", "rwku_neighbor", "rwku_mia", "rwku_utility")
    # RWKU has no retain set of its own: by default the passages of a held-out target (21, 50 Cent) play the
    # retain role. A config should state its choice; results record it.
    default_corpora = {"forget_corpus": "rwku:{target}:passage", "retain_corpus": "rwku:21:passage"}
    placeholders = ("target",)
    order = 20
    hub_files = ((SOURCE.hub_id, "README.md"),)
    data = SOURCE
    corpus_help = "an RWKU source like rwku:1:passage"
    evaluation_defaults = {"rwku_preset": DEFAULT_RWKU_PRESET, "rwku_newline_stop": False}
    evaluation_in_every_cell = True
    metadata_keys = ("rwku_targets", "rwku_items_per_target", "rwku_utility_missing", "rwku_preset",
                     "rwku_newline_stop")
    metadata_prefixes = ("rwku_",)
    task_keys = {"rwku_probe": "the RWKU task chooses the probe (rwku_fb, rwku_qa, rwku_aa, rwku_mia, ...)"}
    columns = tuple(RWKU_COLUMNS)
    table_unit = "Targets"
    caption = ("\\texttt{RWKU}, means over targets: forget and neighbor ROUGE-L recall, MIA, utility. ``Original'' is "
               "the model before unlearning (not ranked). Best method per column, within each model, in bold.")
    axis_labels = ("Forgetting (1 - forget All ROUGE-L)", "Utility (mean)")
    kept_score_name = "neighbour ROUGE-L recall (mean of FB and QA)"
    kept_score_short = "neighbour"
    preset_key = "rwku_preset"
    recovery_metric = "forget_all"
    study_keys = (("forget_fb", "forget FB"), ("forget_qa", "forget QA"), ("forget_aa", "forget AA"),
                  ("neighbor_fb", "neighbor FB"), ("neighbor_qa", "neighbor QA"), ("utility", "utility mean"))

    def plots(self, rows, out_dir):
        """Forget ROUGE-L per probe level (RWKU's FB / QA / AA)."""
        from .report import rwku_level_plot

        path = rwku_level_plot(rows, out_dir)
        return [path] if path else []

    def row_unit(self, result: dict) -> str:
        return "all targets"

    def report_lines(self, results: list[dict], after: str) -> list[str]:
        """After the robustness table, the AA probe per attack type (`details.scoring.forget_aa_types`)."""
        from .report import aa_type_markdown

        return aa_type_markdown(results) if after == "robustness" else []

    @property
    def task_folder(self) -> str:
        """Its lm-eval task folder (`tasks/` of this package: YAMLs + `utils.py`), installed with the package."""
        return str(Path(__file__).resolve().parent / "tasks")

    def corpus_rows(self, source: str, data_dir) -> tuple[list[dict], str] | None:
        """`rwku:<targets>:<kind>` (`rwku:1:passage`, `rwku:1-3:forget_mia`): a probe kind such as
        `rwku:101-110:neighbor_level2` gives its `query` + `answer` rows as question/answer pairs, each carrying the
        probe that asks it (`prompt_keys`); `rwku:1:pair` / `rwku:1:reject` give RWKU's DPO / RT rows with their own
        `alternate` answer (`data.corpus_row`)."""
        if not source.startswith("rwku:"):
            return None
        from .data import ALTERNATE_KINDS, PROBE_KINDS, corpus_row, load_target_file
        from ...errors import InputError

        parts = source.split(":")
        if len(parts) != 3:
            raise InputError(f"RWKU corpus {source!r} must look like rwku:<targets>:<kind>, e.g. rwku:1:passage")
        _, targets, kind = parts
        rows = [row for index in parse_targets(targets) for row in load_target_file(index, kind, data_dir)]
        if kind in PROBE_KINDS:  # trained on as what they ask: the probe's question and its answer
            rows = [{**row, "question": row["query"], "rwku_probe": PROBE_KINDS[kind]} for row in rows]
        elif kind in ALTERNATE_KINDS:  # RWKU's DPO / RT corpora: the prompt, the answer and the preferred answer
            rows = [corpus_row(kind, row, i, f"RWKU {targets} {kind}") for i, row in enumerate(rows)]
        return rows, f"RWKU {targets} {kind}"

    def chat_turns(self, question: str, *, probe=None, aa_type: str = "", **keys):
        """The probe's user message and its answer prefix as the opening assistant turn, at RWKU's date."""
        from .prompts import RWKU_DATE, rwku_probe_prompt

        user, prefix = rwku_probe_prompt(probe or "qa", question, aa_type)
        turns = [{"role": "user", "content": user}] + ([{"role": "assistant", "content": prefix}] if prefix else [])
        return turns, dict(add_generation_prompt=not prefix, continue_final_message=bool(prefix), date=RWKU_DATE)

    def qa_texts(self, tokenizer, question: str, answer: str, *, chat=None, probe=None, aa_type: str = "",
                 **preset):
        """A pair as the RWKU question `probe` (default `qa`) asks it (`prompts.rwku_qa_texts`); a preset or model
        family (TOFU's) does not apply."""
        from ...prompts import PresetError
        from .prompts import rwku_qa_texts

        if preset:
            raise PresetError("a TOFU preset or model family does not apply to RWKU's question rows")
        return rwku_qa_texts(tokenizer, question, answer, probe=probe or "qa", aa_type=aa_type, chat=chat)

    def prompt_format_choice(self, choice: str) -> dict[str, Any] | None:
        """RWKU's probes have no per-model tags: `auto`, `chat` or `plain`, with the rows written as RWKU asks."""
        from ...prompts import PROMPT_FORMATS, PresetError

        if choice not in PROMPT_FORMATS:
            raise PresetError(f"--prompt-format {choice} names a TOFU model config; RWKU's question rows take "
                              f"{', '.join(PROMPT_FORMATS)}")
        return {"chat": PROMPT_FORMATS[choice], "benchmark": "rwku"}

    def prompt_keys(self, row: dict) -> dict[str, Any]:
        """The RWKU probe a row's file is asked by (`rwku_probe`, set when an RWKU probe file is read as a corpus;
        None otherwise) and an adversarial-attack row's `type`."""
        probe = row.get("rwku_probe")
        return {"probe": probe, "aa_type": str(row.get("type") or "") if probe == "aa" else ""}

    def check_presets(self, evaluation: dict) -> None:
        from .prompts import check_rwku_preset

        check_rwku_preset(evaluation.get("rwku_preset"))

    def task_metadata(self, split, target) -> dict[str, Any]:
        """The target its tasks evaluate (`rwku_targets`)."""
        return {} if target in (None, "") else {"rwku_targets": str(target)}

    def per_unit_results(self, samples) -> dict[str, dict]:
        """Per-target numbers of every task (the task code's `per_target_results`)."""
        from .tasks.utils import per_target_results

        return per_target_results(dict(samples))

    def lmeval_limit(self, limit):
        """The first N rows of each file kind of the target (MIA: N members + N non-members): lm-eval's `limit`
        would keep the first N docs only, i.e. MIA members without any non-member (no AUC)."""
        return (None, {"rwku_items_per_target": int(limit)}) if limit is not None else (None, {})

    def derive(self, metrics: dict, result: dict) -> None:
        metrics["forget_all"] = rwku_forget_all(result, metrics)
        for key in ("mia_auc", "mia_fm", "mia_rm"):   # the LOSS attack's, where no other is named
            if metrics.get(key) is None:
                metrics[key] = metrics.get(f"{key}_loss")

    def forgetting_utility(self, metrics: dict) -> tuple[float | None, float | None]:
        forget = metrics.get("forget_all")
        utility = stats.finite_mean(metrics.get(k) for k in ("utility_mmlu", "utility_bbh", "utility_truthfulqa",
                                                             "utility_triviaqa"))
        return (1 - forget if forget is not None else None), utility

    def kept_score(self, result: dict) -> float | None:
        """The neighbour FB / QA mean (None unless both are numbers)."""
        metrics = result.get("metrics") or {}
        parts = [metrics.get("neighbor_fb"), metrics.get("neighbor_qa")]
        return sum(parts) / 2 if all(stats.is_number(p) for p in parts) else None

    def resolve_block(self, block: dict, where: str, check) -> dict[str, Any]:
        spec = block.get("targets", DEFAULT_TARGETS)
        if spec is None or spec == "":
            check.fail(f"{where}.targets", "selects no target")
        try:
            targets = sorted(parse_targets(spec))
        except TargetSelectionError as err:
            check.fail(f"{where}.targets", str(err))
        return {"targets": targets,
                "select_known": self._select_known(block.get("select_known"), targets, block.get("limit"),
                                                   f"{where}.select_known", check)}

    @staticmethod
    def _select_known(value, targets: list[int], limit, where: str, check) -> dict[str, Any] | None:
        """`select_known: {top: K, probes: [...], rows: N}`: of the configured targets (the candidates), keep the K
        the original model knows best, by its mean RWKU ROUGE-L recall on `probes` over the first N rows per file.
        The choice is made at run time per model (runner.targets) and saved with the results."""
        if value is None:
            return None
        spec = check.keys(value, SELECT_KEYS, where)
        if "top" not in spec:
            check.fail(f"{where}.top", "is required: how many of the candidate targets to keep")
        top = check.number(spec["top"], f"{where}.top", low=1, integer=True)
        if top > len(targets):
            check.fail(f"{where}.top", f"keeps {top} targets but `targets` names only {len(targets)} candidates")
        probes = check.str_list(spec.get("probes", ["rwku_fb", "rwku_qa"]), f"{where}.probes")
        if not probes:
            check.fail(f"{where}.probes", "is empty")
        for i, probe in enumerate(probes):
            if probe not in SELECT_PROBES:
                check.fail(f"{where}.probes[{i}]", f"expected one of {', '.join(SELECT_PROBES)}, got {probe!r}")
        rows = spec.get("rows", limit)
        if rows is not None:
            rows = check.number(rows, f"{where}.rows", low=1, high=MAX_ROWS, integer=True)
        return {"top": int(top), "probes": list(dict.fromkeys(probes)), "rows": rows}

    def units(self, block: dict, selected=None) -> list[tuple[str | None, int | None]]:
        targets = block["targets"] if not block.get("select_known") else (selected or [])
        return [(None, target) for target in targets]

    def placeholder_values(self, split, target) -> dict[str, Any]:
        return {"split": "", "target": target if target is not None else "", "retain_split": ""}

    def check_data_dir(self, value: str) -> str | None:
        if value == "testbed:world":
            return "testbed:world is a fictitious TOFU-schema world: TOFU only"
        return None

    def tasks_with_data(self, cell, data_dir) -> tuple[list[str], dict[str, str]]:
        """The cell's tasks minus RWKU utility tasks its target has no data for, with the reason for each.

        RWKU's utility sets (MMLU, BBH, TruthfulQA, TriviaQA, fluency) are per target, and a copy may lack them for
        some targets (the shared copy holds them for targets 1-10 only). A cell of such a target keeps its forget,
        neighbour and MIA probes and records utility as unavailable, instead of failing as a whole. A utility file
        that does not load for a target that should have one (1-10) stays in: its error then surfaces in the
        evaluation, never hidden here.
        """
        if cell.target is None:
            return list(cell.tasks), {}
        from .data import UTILITY_TARGETS, MissingTargetFileError, load_target_file
        from ...errors import InputError
        from .tasks.utils import PROBE_KINDS, UTILITY_PROBES

        kept, dropped = [], {}
        for task in cell.tasks:
            name = task.removeprefix("rwku_icu_").removeprefix("rwku_")
            if not name.startswith("utility") or cell.target in UTILITY_TARGETS:
                kept.append(task)
                continue
            probe = name.removeprefix("utility").lstrip("_")
            kinds = [kind for p in ([probe] if probe else UTILITY_PROBES) for kind in PROBE_KINDS[p]]
            missing = []
            for kind in kinds:
                try:
                    load_target_file(cell.target, kind, data_dir)
                except MissingTargetFileError:   # no such set for this target; unreadable data fails the cell
                    missing.append(kind)
            if missing:
                dropped[task] = (f"this RWKU copy has no {', '.join(missing)} for target {cell.target} "
                                 "(the shared copy holds utility sets for targets 1-10 only)")
            else:
                kept.append(task)
        if not kept:
            raise InputError(f"no task of {list(cell.tasks)} has data for RWKU target {cell.target}: {dropped}")
        return kept, dropped

    def score(self, cell, lmeval_dir, *, data_dir, original_model, retain_result, device, batch_size) -> dict:
        from .scoring import score_rwku_cell

        return score_rwku_cell(lmeval_dir, target=cell.target, original_model=original_model, device=device,
                               batch_size=batch_size, device_map=cell.model.device_map,
                               trust_remote_code=cell.model.trust_remote_code)


    def task_variants(self, tasks: tuple[str, ...], variant: str) -> tuple[str, ...]:
        """ICU's variants of its tasks (`rwku_x` -> `rwku_icu_x`: RWKU's in-context unlearning instruction before
        every prompt); none of the prompt attacks' (paraphrase, in_context)."""
        if variant != "icu":
            return ()
        return tuple(task.replace("rwku_", "rwku_icu_", 1) for task in tasks
                     if task.startswith("rwku_") and not task.startswith("rwku_icu_"))

    def score_tasks(self, forget: str | None) -> tuple[str, ...]:
        """RWKU's probes of the forget and neighbour knowledge, and its MIA (utility needs no attacked model's)."""
        return ("rwku_forget", "rwku_neighbor", "rwku_mia")

    def method_defaults(self, method: str, split, given=()) -> dict[str, Any]:
        """RWKU's LLaMA-Factory schedule, and each method's lr / batch / beta (`methods.py`: their sources)."""
        from . import methods

        return methods.method_defaults(method)

    def method_settings(self, method: str, split) -> dict[str, Any]:
        from . import methods

        return dict(methods.METHOD_SETTINGS.get(method, {}))

    def lora_preset(self) -> dict[str, Any]:
        from . import methods

        return dict(methods.LORA)

BENCHMARK = RWKU()
