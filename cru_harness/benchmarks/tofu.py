"""TOFU (Maini et al. 2024): fictitious authors. A cell's unit is a forget split; its oracle is the retain model
(Forget Quality); lm-eval tasks in `tasks/tofu`; scored by `scoring.cell_scores.score_tofu_cell`."""
from __future__ import annotations

from typing import Any

from ..api import Benchmark
from ..reporting.stats import is_number
from ..reporting.tables import Column, fc_columns
from ..data.sources import HUB_IDS
from ..data.tofu import FORGET_SPLITS, IDK_HUB, retain_config_for


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

def strongest_attack(metrics: dict) -> str | None:
    """The MIA attack whose AUC is farthest from 0.5: the one that best tells forget from holdout text (the AUCs a
    cell records: `scoring.cell_scores.PRIVACY_METRICS`)."""
    from ..scoring.cell_scores import PRIVACY_METRICS

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
    hub_files = ((HUB_IDS["tofu"], "README.md"), IDK_HUB)
    data_source = "tofu"   # also its subclasses' (tofu_author)
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
        from ..prompts import tofu_format

        tofu_format(evaluation["tofu_preset"], evaluation["tofu_model_family"])

    def tasks_under(self, tasks: list[str], evaluation: dict, defaulted: bool) -> list[str]:
        """Under the legacy preset (TOFU's own evaluation): no privacy task (TOFU's code has no privacy metrics; the
        task refuses the preset) and no in_context variant (its 200-token cut would cut the answers)."""
        from ..prompts import PresetError, tofu_preset_refusal

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
        from ..prompts import tofu_format

        return tofu_format(evaluation["tofu_preset"], evaluation["tofu_model_family"]) is not None

    def training_prompt_format(self, cell, chat: bool, presets: dict) -> dict[str, Any]:
        return {"chat": bool(chat), "preset": presets["tofu_preset"], "family": presets["tofu_model_family"]}

    def lens_rows(self, cell, data_dir) -> tuple[list[dict], str]:
        """The forget task's items, in its order, under the cell's `limit` (lm-eval's: the first N)."""
        from ..data.tofu import load_tofu

        config = f"{cell.split}_perturbed"   # the forget task's file: the forget split's questions and answers
        rows = load_tofu(config, data_dir)
        return rows[:cell.limit] if cell.limit else rows, f"TOFU {config}"

    def score(self, cell, lmeval_dir, *, data_dir, original_model, retain_result, device, batch_size) -> dict:
        from ..scoring import cell_scores
        from ..scoring.score import forget_task_for

        forget_task = forget_task_for(cell.split, cell.tasks)   # an attack cell's variant, where it has one
        retain_items = cell_scores.forget_items_from_result(retain_result, forget_task) if retain_result else None
        return cell_scores.score_tofu_cell(lmeval_dir, split=cell.split, retain_items=retain_items,
                                           original_model=original_model, data_dir=data_dir, device=device,
                                           batch_size=batch_size, device_map=cell.model.device_map,
                                           trust_remote_code=cell.model.trust_remote_code,
                                           retain_result=retain_result, forget_task=forget_task,
                                           is_oracle=cell.kind == "retain")


BENCHMARK = TOFU()
