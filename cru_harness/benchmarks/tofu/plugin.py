"""TOFU (Maini et al. 2024): fictitious authors. A cell's unit is a forget split; its oracle is the retain model
(Forget Quality, privleak); lm-eval tasks in its `tasks/`; scored by `scoring.score_tofu_cell`."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from ...api import Benchmark
from .data import FORGET_SPLITS, IDK_HUB, SOURCE, TOFU_CONFIGS, retain_config_for
from ...errors import InputError, MissingInputError
from .prompts import DEFAULT_TOFU_PRESET, OPEN_UNLEARNING_FORMATS
from ...reporting.stats import is_number
from ...reporting.tables import Column, fc_columns


TOFU_COLUMNS = [
    Column("forget_1_rouge_l", "1-ROUGE-L ↑", "(1-Rouge-L)$\\uparrow$", "up", "Forget"),
    Column("forget_1_prob", "1-Prob. ↑", "(1-Prob.)$\\uparrow$", "up", "Forget"),
    # mean(min(R, 1/R)): 1 = no preference of the true answer over perturbed ones (TOFU, open-unlearning)
    Column("forget_truth_ratio", "Truth ratio ↑", "Truth ratio$\\uparrow$", "up", "Forget"),
    Column("forget_quality", "FQ ↑", "FQ$\\uparrow$", "up", "Forget"),
    *fc_columns("forget"),
    *[Column(f"{s}_{m}", f"{name} {mh} ↑", f"{ml}$\\uparrow$", "up", name)
      for s, name in (("ra", "Real Authors"), ("wf", "World Facts"), ("retain", "Retain Set"))
      for m, mh, ml in (("rouge_l", "ROUGE-L", "Rouge-L"), ("prob", "Prob.", "Prob."),
                        ("truth_ratio", "TR", "Truth ratio"))],
    Column("model_utility", "MU ↑", "MU$\\uparrow$", "up", ""),
    # the privacy block (a cell that ran tofu_privacy_<split>): privleak against the retain oracle, 0 is best;
    # the strongest attack's AUC, not ranked: the right value is the retain oracle's, which is not 0.5 when forget
    # and holdout questions differ (docs/protocol.md)
    Column("privleak", "privleak →0", "privleak$\\to$0", "zero", "Privacy", optional=True),
    Column("mia_auc_best", "best MIA AUC", "best MIA AUC", None, "Privacy", optional=True),
]

#: The in_context attack's settings (`Attack.task_metadata`) -> the metadata its TOFU task variants read.
IN_CONTEXT_KEYS = {"k": "tofu_icl_k", "slice_fraction": "tofu_icl_slice_fraction", "slice_size": "tofu_icl_slice_size",
                   "seed": "tofu_icl_seed"}
_FORGET = re.compile(r"tofu_(forget\d\d)")
_SUITE = re.compile(r"tofu_(forget\d\d)_suite")
#: What a `tofu_forgetXX_suite` group holds beside its forget task (tasks/tofu_forgetXX_suite.yaml).
SUITE_UTILITY_TASKS = ("tofu_retain", "tofu_real_authors", "tofu_world_facts")


def variant_tasks(tasks: tuple[str, ...], variant: str) -> tuple[str, ...]:
    """`tasks` with each TOFU forget task replaced by its `variant` (a suite group by its members, the forget one
    replaced: lm-eval cannot swap one task inside a group); every other task unchanged."""
    out: list[str] = []
    for task in tasks:
        if _FORGET.fullmatch(task):
            out.append(f"{task}_{variant}")
        elif (suite := _SUITE.fullmatch(task)):
            out.extend((f"tofu_{suite.group(1)}_{variant}", *SUITE_UTILITY_TASKS))
        else:
            out.append(task)
    return tuple(dict.fromkeys(out))


def retain_from_per_item(path: str, forget_task: str | None = None) -> dict:
    """A retain model given as a saved per-item file: its forget truth ratios (and questions, to match items)
    feed Forget Quality. `.json`: a cell result (or its `per_item`); else a `per_item.jsonl` written by `score`."""
    import json

    from ...store import read_json

    values, questions = [], []
    file = Path(path)
    if not file.is_file():
        raise MissingInputError(f"retain per-item file not found: {path}")
    if file.suffix == ".json":
        data = read_json(file)
        per_item = data.get("per_item", data)
        values = per_item.get("forget_truth_ratio", [])
        questions = per_item.get("forget_question") or []
    else:
        for line_no, line in enumerate(file.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{path}:{line_no}: not a JSON line ({err})") from None
            task = row.get("task", "")
            if (task == forget_task if forget_task else task.startswith("tofu_forget")) and \
                    row.get("truth_ratio") is not None:
                if "question" not in row:
                    raise InputError(f"{path}:{line_no}: a forget row without its question")
                values.append(row["truth_ratio"])
                questions.append(row["question"])
    if not values:
        raise InputError(f"{path} holds no forget-set truth ratios for {forget_task or 'tofu_forget*'} "
                         f"(field forget_truth_ratio / truth_ratio)")
    per_item = {"forget_truth_ratio": values}
    if questions and len(questions) == len(values):
        per_item["forget_question"] = questions
    return {"per_item": per_item, "details": {"retain_source": str(path)}}


def strongest_attack(metrics: dict) -> str | None:
    """The MIA attack whose AUC is farthest from 0.5: the one that best tells forget from holdout text (the AUCs a
    cell records: `scoring.PRIVACY_METRICS`)."""
    from .scoring import PRIVACY_METRICS

    found = [key for key in PRIVACY_METRICS.values() if key.startswith("mia_auc_") and is_number(metrics.get(key))]
    return max(found, key=lambda key: abs(metrics[key] - 0.5)) if found else None


def _best_attack(metrics: dict) -> str | None:
    """Set `mia_auc_best` to the strongest membership attack's AUC (`strongest_attack`); returns that attack."""
    best = strongest_attack(metrics)
    metrics["mia_auc_best"] = metrics[best] if best else None
    return best


class TOFU(Benchmark):
    name = "tofu"
    summary = ("TOFU: 200 fictitious authors; forget01/05/10 splits, Forget Quality against a retain oracle, "
               "Model Utility")
    unit = "split"
    config_keys = ("splits", "tasks", "limit", "forget_corpus", "retain_corpus", "data_dir")
    default_tasks = ("tofu_{split}", "tofu_retain", "tofu_real_authors", "tofu_world_facts", "tofu_privacy_{split}")
    default_corpora = {"forget_corpus": "{split}", "retain_corpus": "{retain_split}"}
    placeholders = ("split", "retain_split")
    has_oracle = True
    order = 10
    hub_files = ((SOURCE.hub_id, "README.md"), IDK_HUB)
    data = SOURCE   # also its subclasses' (tofu_author)
    default_questions = True   # the training code's default question format is TOFU's
    prompt_families = tuple(OPEN_UNLEARNING_FORMATS)
    prompt_family_setting = "--metadata '{\"tofu_model_family\": NAME}'"
    corpus_help = f"a TOFU config ({', '.join(TOFU_CONFIGS)})"
    evaluation_defaults = {"tofu_preset": DEFAULT_TOFU_PRESET, "tofu_model_family": None}
    evaluation_in_every_cell = True
    metadata_keys = ("tofu_preset", "tofu_model_family", *IN_CONTEXT_KEYS.values())
    metadata_prefixes = ("tofu_",)
    task_keys = {"tofu_config": "the TOFU task chooses the split (tofu_forget01, tofu_forget10, tofu_retain, ...)",
                 "tofu_variant": "the TOFU task chooses the attack variant (tofu_forget10_paraphrase, "
                                 "tofu_forget10_in_context, ...)"}
    oracle_kinds = ("checkpoint", "per_item", "train", "finetune")
    columns = tuple(TOFU_COLUMNS)
    table_unit = "Split"
    caption = ("\\texttt{TOFU}: forgetting on the forget set, Forget Quality, utility on Real Authors, World Facts "
               "and the Retain set, Model Utility. ``Original'' is the model before unlearning (not ranked). "
               "Best method per column, within each model and split, in bold.")
    axis_labels = ("Forgetting (1 - forget ROUGE-L)", "Model Utility")
    kept_score_name = "Model Utility"
    kept_score_short = "MU"
    preset_key = "tofu_preset"
    recovery_metric = "forget_rouge_l"
    study_keys = (("forget_1_rouge_l", "forget 1-ROUGE-L"), ("forget_quality", "FQ"), ("model_utility", "MU"),
                  ("retain_rouge_l", "retain ROUGE-L"), ("ra_rouge_l", "real authors ROUGE-L"),
                  ("wf_rouge_l", "world facts ROUGE-L"))
    stats_note = ("the blocks are not independent samples: one model's splits share authors (forget01 is in "
                  "forget05, forget05 in forget10), so the p-values describe these runs; they do not generalise")

    @property
    def task_folder(self) -> str:
        """Its lm-eval task folder (`tasks/` of this package: YAMLs + `utils.py`), installed with the package."""
        return str(Path(__file__).resolve().parent / "tasks")

    def corpus_rows(self, source: str, data_dir) -> tuple[list[dict], str] | None:
        """A TOFU config name (`forget10`, `retain90`, `full`, ...)."""
        from .data import load_tofu

        return (load_tofu(source, data_dir), f"TOFU {source}") if source in TOFU_CONFIGS else None

    def refusals(self, data_dir) -> list[str]:
        """TOFU's `idontknow` answers (`data.load_idontknow`)."""
        from .data import load_idontknow

        return load_idontknow(data_dir)

    def qa_texts(self, tokenizer, question: str, answer: str, *, chat=None, preset=None, family=None, **row):
        """A pair under a TOFU preset and model family (`prompts.tofu_qa_texts`); a row's other keywords (an RWKU
        probe) do not apply: TOFU has one question format."""
        from .prompts import tofu_qa_texts

        return tofu_qa_texts(tokenizer, question, answer, preset=preset, family=family, chat=chat)

    def prompt_format_choice(self, choice: str) -> dict[str, Any] | None:
        """An open-unlearning model config's tags (`{"chat": False, "family": NAME}`); an unknown name fails naming
        the valid ones."""
        from ...prompts import PROMPT_FORMATS
        from .prompts import tofu_format

        if choice in PROMPT_FORMATS:
            return None
        tofu_format(DEFAULT_TOFU_PRESET, choice)
        return {"chat": False, "family": choice}

    def check_presets(self, evaluation: dict) -> None:
        from .prompts import check_tofu_preset

        check_tofu_preset(evaluation.get("tofu_preset"))

    def finetune_prompt_format(self, cell, chat: bool, presets: dict) -> dict[str, Any]:
        """TOFU's recipe writes its rows under the TOFU presets (the oracle's and the model's own fine-tune)."""
        return {"chat": bool(chat), "preset": presets["tofu_preset"], "family": presets["tofu_model_family"]}

    def task_variants(self, tasks: tuple[str, ...], variant: str) -> tuple[str, ...]:
        """The forget tasks' `tofu_forgetXX_<variant>` (in its `tasks/`), alone."""
        return tuple(task for task in variant_tasks(tasks, variant) if task not in tasks
                     and task not in SUITE_UTILITY_TASKS)

    def variant_metadata(self, variant: str, settings: Mapping[str, Any]) -> dict[str, Any]:
        return {IN_CONTEXT_KEYS[key]: value for key, value in settings.items() if key in IN_CONTEXT_KEYS} \
            if variant == "in_context" else {}

    def forget_items(self, cell, data_dir) -> tuple[list[dict], str]:
        """The forget task's file: the forget split's questions and answers, in the task's order."""
        from .data import load_tofu

        config = f"{cell.split}_perturbed"
        return load_tofu(config, data_dir), f"TOFU {config}"

    def unit_items(self, split, target) -> frozenset | None:
        """A forget split's rows of `full` (`rows`)."""
        from .rows import config_rows, items

        return items(config_rows(split)) if split else None

    def corpus_items(self, source: str) -> frozenset | None:
        from .rows import items, source_rows

        return items(source_rows(source))

    def forget_task(self, split: str) -> str:
        """The lm-eval forget task of a unit, whose truth ratios Forget Quality compares with the oracle's."""
        return f"tofu_{split}"

    def oracle_from_file(self, path: str, cell) -> dict:
        """`retain: {per_item: FILE}`: the retain model's forget truth ratios (Forget Quality's reference)."""
        return retain_from_per_item(path, self.forget_task(cell.split))

    def oracle_as_reference(self, tasks: tuple[str, ...]) -> bool:
        """The privacy tasks' reference attack reads the retain model (open-unlearning's TOFU config names it)."""
        return any(task.startswith("tofu_privacy_") for task in tasks)

    def compare_to_oracle(self, result: dict, oracle: dict | None) -> None:
        """Forget Quality and privleak against the retain cell of the same model and split, by the scorer's rules
        (`score.forget_quality_from_items`: items matched by question, NaN refused; `scoring.privleak_of`). That
        is the number a cell records when scored beside the same oracle; it also fills a cell scored before its
        oracle existed (another shard's, a later one), and replaces one scored against another oracle: the oracle
        is not in a method cell's hash, so a cell reused after the oracle changed keeps its old comparison. The
        retain cell's own privleak is 0, against itself (as MUSE reports its retain model). Without both per-item
        lists (both AUCs) the recorded value stays."""
        from .scoring import PRIVLEAK_AUC, forget_items_from_result, privleak_of
        from .score import forget_quality_from_items

        if result.get("kind") != "retain":
            task = self.forget_task(result["split"])
            mine = forget_items_from_result(result, task)
            reference = forget_items_from_result(oracle, task) if oracle else None
            if mine and reference:
                value = forget_quality_from_items(task, mine, reference, reference[0]["run"])["value"]
                result.setdefault("metrics", {})["forget_quality"] = value
        auc = (result.get("metrics") or {}).get(PRIVLEAK_AUC)
        retain_auc = ((oracle or {}).get("metrics") or {}).get(PRIVLEAK_AUC)
        if auc is not None and retain_auc is not None:
            result["metrics"]["privleak"] = privleak_of(auc, retain_auc)[0]

    def report_lines(self, results: list[dict], after: str) -> list[str]:
        """After its table, the regime check: the Original model's forget ROUGE-L and Prob. against its oracle's."""
        from .report import regime_check_markdown

        return regime_check_markdown(results) if after == "table" and self.has_oracle else []

    def derive(self, metrics: dict, result: dict) -> None:
        for key in ("rouge_l", "prob"):
            value = metrics.get(f"forget_{key}")
            metrics[f"forget_1_{key}"] = 1 - value if is_number(value) else None
        _best_attack(metrics)

    def derive_mean(self, metrics: dict, spread: dict) -> None:
        """The strongest attack of the seeds' mean AUCs: seeds whose best attacks lie on opposite sides of 0.5
        (0.25 and 0.80) would otherwise average to a chance-like 0.525."""
        best = _best_attack(metrics)
        spread.pop("mia_auc_best", None)
        if best in spread:
            spread["mia_auc_best"] = spread[best]

    def forgetting_utility(self, metrics: dict) -> tuple[float | None, float | None]:
        rouge = metrics.get("forget_rouge_l")
        return (1 - rouge if is_number(rouge) else None), metrics.get("model_utility")

    def kept_score(self, result: dict) -> float | None:
        """Model Utility."""
        metrics = result.get("metrics") or {}
        return metrics.get("model_utility") if is_number(metrics.get("model_utility")) else None

    def resolve_block(self, block: dict, where: str, check) -> dict[str, Any]:
        splits = check.str_list(block.get("splits", ["forget10"]), f"{where}.splits")
        for i, split in enumerate(splits):
            if split not in FORGET_SPLITS:
                check.fail(f"{where}.splits[{i}]", f"TOFU has no forget split {split!r}; valid: "
                           f"{', '.join(FORGET_SPLITS)}")
        if len(set(splits)) != len(splits):
            check.fail(f"{where}.splits", f"repeats a split: {splits}")
        return {"splits": splits}

    def units(self, block: dict, selected=None) -> list[tuple[str | None, int | None]]:
        return [(split, None) for split in block["splits"]]

    def placeholder_values(self, split, target) -> dict[str, Any]:
        return {"split": split or "", "target": "", "retain_split": retain_config_for(split) if split else ""}

    def check_evaluation(self, evaluation: dict) -> None:
        from .prompts import tofu_format

        tofu_format(evaluation["tofu_preset"], evaluation["tofu_model_family"])

    def tasks_under(self, tasks: list[str], evaluation: dict, defaulted: bool) -> list[str]:
        """Under the legacy preset (TOFU's own evaluation): no privacy task (TOFU's code has no privacy metrics; the
        task refuses the preset) and no in_context variant (its 200-token cut would cut the answers)."""
        from ...prompts import PresetError
        from .prompts import tofu_preset_refusal

        kept = []
        for task in tasks:
            if refusal := tofu_preset_refusal(evaluation["tofu_preset"], task):
                if defaulted:
                    continue
                raise PresetError(f"task {task}: {refusal}")
            kept.append(task)
        return kept

    def fixed_prompt_format(self, evaluation: dict) -> bool:
        """A preset and `tofu_model_family` that fix the text format (legacy, or an open-unlearning model config
        without a chat template): the reference writes those prompts itself."""
        from .prompts import tofu_format

        return tofu_format(evaluation["tofu_preset"], evaluation["tofu_model_family"]) is not None

    def training_prompt_format(self, cell, chat: bool, presets: dict) -> dict[str, Any]:
        return {"chat": bool(chat), "preset": presets["tofu_preset"], "family": presets["tofu_model_family"]}

    def lens_rows(self, cell, data_dir) -> tuple[list[dict], str]:
        """The forget task's items (`forget_items`), in its order, under the cell's `limit` (lm-eval's: the first N)."""
        rows, source = self.forget_items(cell, data_dir)
        return rows[:cell.limit] if cell.limit else rows, source

    def score(self, cell, lmeval_dir, *, data_dir, original_model, retain_result, device, batch_size) -> dict:
        from . import scoring
        from .score import forget_task_for

        forget_task = forget_task_for(cell.split, cell.tasks)   # an attack cell's variant, where it has one
        retain_items = scoring.forget_items_from_result(retain_result, forget_task) if retain_result else None
        return scoring.score_tofu_cell(lmeval_dir, split=cell.split, retain_items=retain_items,
                                       original_model=original_model, data_dir=data_dir, device=device,
                                       batch_size=batch_size, device_map=cell.model.device_map,
                                       trust_remote_code=cell.model.trust_remote_code,
                                       retain_result=retain_result, forget_task=forget_task,
                                       is_oracle=cell.kind == "retain")


    def score_tasks(self, forget: str | None) -> tuple[str, ...]:
        """The suite of the forget split it was attacked on (forget10 otherwise)."""
        return (f"tofu_{forget if forget in FORGET_SPLITS else 'forget10'}_suite",)

    def prompt_metadata(self, prompt_format: str) -> dict[str, Any]:
        """A model family's format is TOFU's per-model prompt (`tofu_model_family`)."""
        return {} if prompt_format in ("chat", "plain") else {"tofu_model_family": prompt_format}

    def method_defaults(self, method: str, split, given=()) -> dict[str, Any]:
        """The trainers' defaults are TOFU's protocol; SimNPO's strength per split (`methods.py`)."""
        from . import methods

        return methods.method_defaults(method, split, given, FORGET_SPLITS)

BENCHMARK = TOFU()
