"""LUNAR's single-author TOFU split (Shen et al. 2025, "LUNAR: LLM Unlearning via Neural Activation Redirection"):
forget one TOFU author, keep the others, scored by LUNAR's deviation score. A cell's unit is an author (`author_K`,
LUNAR's edge name); the rows are TOFU's (`benchmarks.tofu.data.load_author_rows`); lm-eval tasks `tofu_author_forget` /
`tofu_author_retain` (author from the metadata `tofu_author`); scored by `scoring.score_tofu_author_cell`.
There is no retain oracle: LUNAR's score needs none."""
from __future__ import annotations

from typing import Any

from ..tofu.data import parse_author_source
from ...metrics import deviation_score
from ...reporting.stats import is_number
from ...reporting.tables import Column, fc_columns
from ..tofu import TOFU

TOFU_AUTHOR_COLUMNS = (
    Column("deviation_score", "Deviation score ↓", "DS$\\downarrow$", "down", ""),
    Column("forget_rouge1", "forget ROUGE-1 ↓", "ROUGE-1$\\downarrow$", "down", "Forget"),
    Column("retain_rouge1", "retain ROUGE-1 ↑", "ROUGE-1$\\uparrow$", "up", "Retain"),
    Column("forget_rouge_l", "forget ROUGE-L ↓", "Rouge-L$\\downarrow$", "down", "Forget"),
    Column("retain_rouge_l", "retain ROUGE-L ↑", "Rouge-L$\\uparrow$", "up", "Retain"),
    *fc_columns("forget"),
)
DEVIATION_NOTE = ("Deviation score = 100 · sqrt(ROUGE1_forget² + (1 − ROUGE1_retain)²), ROUGE-1 recall of the greedy "
                  "answers on the author's rows (forget) and on the first 200 rows of the other authors (retain): "
                  "the distance from the ideal point (0 on forget, 1 on retain); lower is better. Source: LUNAR "
                  "(Shen et al. 2025), its deviation score; per cell, then the mean over seeds.")


def author_split(author: int) -> str:
    return f"author_{author}"


class TOFUAuthor(TOFU):
    name = "tofu_author"
    summary = "TOFU, one author forgotten (LUNAR's split): ROUGE-1 recall on forget / retain, deviation score"
    unit = "split"
    config_keys = ("authors", "tasks", "limit", "forget_corpus", "retain_corpus", "data_dir")
    default_tasks = ("tofu_author_forget", "tofu_author_retain")
    default_corpora = {"forget_corpus": "{split}", "retain_corpus": "{retain_split}"}
    placeholders = ("split", "retain_split")
    has_oracle = False
    oracle_kinds = ()
    order = 11
    corpus_help = "a TOFU author (author_1, not_author_1)"
    default_questions = False   # TOFU's own plugin is the default; this one asks TOFU's questions when named
    metadata_keys = (*TOFU.metadata_keys, "tofu_author")
    task_keys = {**TOFU.task_keys,
                 "tofu_author_set": "the TOFU task chooses the set (tofu_author_forget, tofu_author_retain)"}
    columns = TOFU_AUTHOR_COLUMNS
    table_unit = "Author"
    table_note = DEVIATION_NOTE
    caption = ("\\texttt{TOFU}, one author forgotten (LUNAR's split): ROUGE-1 recall on the author's rows and on "
               "the other authors', and LUNAR's deviation score $100\\sqrt{R_f^2 + (1-R_r)^2}$ (lower is better). "
               "``Original'' is the model before unlearning (not ranked). Best method per column in bold.")
    axis_labels = ("Forgetting (1 - forget ROUGE-1)", "retain ROUGE-1")
    kept_score_name = None
    kept_score_short = ""
    recovery_metric = "forget_rouge1"
    study_keys = (("deviation_score", "deviation score"), ("forget_rouge1", "forget ROUGE-1"),
                  ("retain_rouge1", "retain ROUGE-1"))
    stats_note = "one author per block: the p-values describe these runs"

    def corpus_rows(self, source: str, data_dir) -> tuple[list[dict], str] | None:
        """LUNAR's single-author split: `author_K` (author K's 20 rows of `full`), `not_author_K` (the others')."""
        from ..tofu.data import load_author_rows

        if (author := parse_author_source(source)) is None:
            return None
        return load_author_rows(author[0], data_dir, others=author[1]), f"TOFU full {source}"

    def derive(self, metrics: dict, result: dict) -> None:
        forget, retain = metrics.get("forget_rouge1"), metrics.get("retain_rouge1")
        metrics["deviation_score"] = (deviation_score(forget, retain)
                                      if is_number(forget) and is_number(retain) else None)

    def forgetting_utility(self, metrics: dict) -> tuple[float | None, float | None]:
        forget = metrics.get("forget_rouge1")
        return (1 - forget if is_number(forget) else None), metrics.get("retain_rouge1")

    def kept_score(self, result: dict) -> float | None:
        return None

    def resolve_block(self, block: dict, where: str, check) -> dict[str, Any]:
        authors = block.get("authors", [1])
        if not isinstance(authors, list) or not authors:
            check.fail(f"{where}.authors", f"expected a non-empty list of author numbers, got {authors!r}")
        for i, author in enumerate(authors):
            check.number(author, f"{where}.authors[{i}]", low=1, integer=True)
        if len(set(authors)) != len(authors):
            check.fail(f"{where}.authors", f"repeats an author: {authors}")
        return {"splits": [author_split(author) for author in authors]}

    def placeholder_values(self, split, target) -> dict[str, Any]:
        return {"split": split or "", "target": "", "retain_split": f"not_{split}" if split else ""}

    def task_metadata(self, split, target) -> dict[str, Any]:
        parsed = parse_author_source(split or "")
        return {"tofu_author": parsed[0]} if parsed else {}

    def score(self, cell, lmeval_dir, *, data_dir, original_model, retain_result, device, batch_size) -> dict:
        from .scoring import score_tofu_author_cell

        return score_tofu_author_cell(lmeval_dir, original_model=original_model, device=device,
                                      batch_size=batch_size, device_map=cell.model.device_map,
                                      trust_remote_code=cell.model.trust_remote_code)


    def method_defaults(self, method: str, split, given=()) -> dict[str, Any]:
        return {}   # one author's split has no setting of TOFU's protocol (SimNPO's is per split)

    def score_tasks(self, forget: str | None) -> tuple[str, ...]:
        return ()   # its tasks read the author from the unit's metadata: a runner config scores it


BENCHMARK = TOFUAuthor()
