"""TOFU (Maini et al. 2024): fictitious authors. A cell's unit is a forget split; its oracle is the retain model
(Forget Quality); lm-eval tasks in `tasks/tofu`; scored by `reporting.cell_scores.score_tofu_cell`."""
from __future__ import annotations

from typing import Any

from ..api import Benchmark
from ..data.tofu import FORGET_SPLITS, retain_config_for


class TOFU(Benchmark):
    name = "tofu"
    summary = ("TOFU: 200 fictitious authors; forget01/05/10 splits, Forget Quality against a retain oracle, "
               "Model Utility")
    unit = "split"
    config_keys = ("splits", "tasks", "limit", "forget_corpus", "retain_corpus", "data_dir")
    default_tasks = ("tofu_{split}", "tofu_retain", "tofu_real_authors", "tofu_world_facts")
    default_corpora = {"forget_corpus": "{split}", "retain_corpus": "{retain_split}"}
    placeholders = ("split", "retain_split")
    has_oracle = True
    order = 10

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

    def fixed_prompt_format(self, evaluation: dict) -> bool:
        """A preset and `tofu_model_family` that fix the text format (legacy, or an open-unlearning model config
        without a chat template): the reference writes those prompts itself."""
        from ..prompts import tofu_format

        return tofu_format(evaluation["tofu_preset"], evaluation["tofu_model_family"]) is not None

    def training_prompt_format(self, cell, chat: bool, presets: dict) -> dict[str, Any]:
        return {"chat": bool(chat), "preset": presets["tofu_preset"], "family": presets["tofu_model_family"]}

    def score(self, cell, lmeval_dir, *, data_dir, original_model, retain_result, device, batch_size) -> dict:
        from ..reporting import cell_scores

        forget_task = f"tofu_{cell.split}"
        retain_items = cell_scores.forget_items_from_result(retain_result, forget_task) if retain_result else None
        return cell_scores.score_tofu_cell(lmeval_dir, split=cell.split, retain_items=retain_items,
                                           original_model=original_model, data_dir=data_dir, device=device,
                                           batch_size=batch_size, device_map=cell.model.device_map,
                                           trust_remote_code=cell.model.trust_remote_code)


BENCHMARK = TOFU()
