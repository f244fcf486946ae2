"""A window of TOFU authors as a forget set (`tofu_authors`): tuning's validation unit beside a reported TOFU split
(docs/protocol.md, "Tuning"). A unit `authors_3-4` forgets authors 3 and 4 (their 40 rows of `full`); its forget
task `tofu_authors` reads their rows of `retain_perturbed` (TOFU's first 20 authors: paraphrased and perturbed
answers), scored as `tofu_forgetXX` (truth ratio, ROUGE-L, probability; Forget Quality against its own oracle, the
fine-tune without those authors); Model Utility's retain part is `tofu_authors_retain`, `retain_perturbed` without
them. The tasks are TOFU's, parametrised by the metadata `tofu_authors` (`3-4`)."""
from __future__ import annotations

from typing import Any

from .plugin import TOFU
from .rows import PERTURBED_AUTHORS, parse_window, window_rows

FORGET_TASK = "tofu_authors"
RETAIN_TASK = "tofu_authors_retain"


def window_split(first: int, last: int) -> str:
    return f"authors_{first}-{last}"


class TOFUAuthors(TOFU):
    name = "tofu_authors"
    summary = ("TOFU, a window of authors 1-20 forgotten (tuning's validation unit): TOFU's forget metrics and "
               "Forget Quality against the window's own oracle, Model Utility without the window")
    config_keys = ("windows", "tasks", "limit", "forget_corpus", "retain_corpus", "data_dir")
    default_tasks = (FORGET_TASK, RETAIN_TASK, "tofu_real_authors", "tofu_world_facts")
    order = 12
    corpus_help = "a TOFU author window (authors_3-4, not_authors_3-4)"
    metadata_keys = (*TOFU.metadata_keys, "tofu_authors")
    task_keys = {**TOFU.task_keys,
                 "tofu_authors_set": "the TOFU task chooses the set (tofu_authors, tofu_authors_retain)"}
    table_unit = "Authors"
    caption = ("\\texttt{TOFU}, a window of authors forgotten: forgetting on their rows, Forget Quality against "
               "the fine-tune without them, utility on Real Authors, World Facts and the other authors, Model "
               "Utility. ``Original'' is the model before unlearning (not ranked). Best method per column in bold.")
    stats_note = "one author window per block: the p-values describe these runs"

    def forget_task(self, split: str) -> str:
        return FORGET_TASK

    def task_metadata(self, split, target) -> dict[str, Any]:
        window = parse_window(split or "")
        return {"tofu_authors": f"{window[0]}-{window[1]}"} if window else {}

    def placeholder_values(self, split, target) -> dict[str, Any]:
        return {"split": split or "", "target": "", "retain_split": f"not_{split}" if split else ""}

    def corpus_rows(self, source: str, data_dir) -> tuple[list[dict], str] | None:
        """`authors_3-4` (the window's rows of `full`), `not_authors_3-4` (every other row)."""
        from .data import load_tofu

        if (window := parse_window(source)) is None:
            return None
        own = window_rows(window[0], window[1])
        rows = load_tofu("full", data_dir)
        return ([row for i, row in enumerate(rows) if i not in own] if window[2] else [rows[i] for i in own],
                f"TOFU full {source}")

    def forget_items(self, cell, data_dir) -> tuple[list[dict], str]:
        """The window's rows of `retain_perturbed`, as the forget task reads them."""
        from .data import load_tofu

        first, last, _ = parse_window(cell.split)
        rows = load_tofu("retain_perturbed", data_dir)
        return [rows[i] for i in window_rows(first, last)], f"TOFU retain_perturbed {cell.split}"

    def task_variants(self, tasks: tuple[str, ...], variant: str) -> tuple[str, ...]:
        return ()   # the prompt attacks' variants exist for the forgetXX tasks only

    def resolve_block(self, block: dict, where: str, check) -> dict[str, Any]:
        windows = check.str_list(block.get("windows", ["1-2"]), f"{where}.windows")
        splits = []
        for i, text in enumerate(windows):
            window = parse_window(f"authors_{text}")
            if window is None or not 1 <= window[0] <= window[1] <= PERTURBED_AUTHORS:
                check.fail(f"{where}.windows[{i}]", f"expected authors A-B within 1-{PERTURBED_AUTHORS} (those "
                           f"retain_perturbed holds perturbed answers for), A <= B; got {text!r}")
            splits.append(window_split(window[0], window[1]))
        if len(set(splits)) != len(splits):
            check.fail(f"{where}.windows", f"repeats a window: {windows}")
        return {"splits": splits}

    def score(self, cell, lmeval_dir, *, data_dir, original_model, retain_result, device, batch_size) -> dict:
        """`score_tofu_cell` with `tofu_authors` as the forget task; the retain columns from `tofu_authors_retain`."""
        from . import scoring as cell_scores
        from ...store import read_json

        retain_items = cell_scores.forget_items_from_result(retain_result, FORGET_TASK) if retain_result else None
        result = cell_scores.score_tofu_cell(lmeval_dir, split=cell.split, retain_items=retain_items,
                                             original_model=original_model, data_dir=data_dir, device=device,
                                             batch_size=batch_size, device_map=cell.model.device_map,
                                             trust_remote_code=cell.model.trust_remote_code,
                                             retain_result=retain_result, forget_task=FORGET_TASK,
                                             is_oracle=cell.kind == "retain")
        numbers = read_json(result["artifacts"]["scores"])["runs"][0]["tasks"].get(RETAIN_TASK) or {}
        for metric, suffix in cell_scores.TOFU_METRICS.items():
            result["metrics"][f"retain_{suffix}"] = cell_scores.finite_or_none(numbers.get(metric))
        return result


BENCHMARK = TOFUAuthors()
