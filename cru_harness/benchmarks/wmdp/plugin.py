"""WMDP as a runner benchmark (`cru_harness.api.Benchmark`, entry point `cru_harness.benchmarks`: wmdp).

Unit: a domain (`bio`, `cyber`, `chem`; the cell's `split`), or domains trained together (`bio+cyber`, WMDP's
headline RMU run: forget probes both domains' tasks, `forget_acc` their mean; corpora `wmdp:bio+cyber-forget`). Tasks: lm-eval's own `wmdp_<domain>` for every
domain and `mmlu` (`tasks.DEFAULT_TASKS`). Corpora: the domain's WMDP forget corpus, its first 600 passages
(RMU's 150 batches of 4), and Wikitext-2 as retain (`data`). No oracle: WMDP scores against chance (0.25) and the
original model. Scored from lm-eval's accuracies (`scoring`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ...api import Benchmark
from . import data as wmdp_data
from . import report, scoring, tasks

#: RMU's 150 batches of 4 (WMDP's README run), the passages every method trains on (docs/methods.md).
FORGET_PASSAGES = 600
#: Joins the domains of one unit trained on them together (`bio+cyber`; `data.joint_parts`).
JOINT = "+"


class WMDP(Benchmark):
    name = "wmdp"
    summary = ("WMDP: hazardous knowledge per domain (bio, cyber, chem); lm-eval's wmdp_* accuracy against chance "
               "0.25, MMLU kept")
    unit = "split"
    config_keys = ("domains", "tasks", "limit", "forget_corpus", "retain_corpus", "data_dir")
    default_tasks = tasks.DEFAULT_TASKS
    default_corpora = {"forget_corpus": f"wmdp:{{split}}-forget[:{FORGET_PASSAGES}]",
                       "retain_corpus": "wmdp:wikitext"}
    placeholders = ("split",)
    has_oracle = False
    order = 40
    hub_files = (("cais/wmdp", "README.md"), ("cais/mmlu", "README.md"))
    data = wmdp_data.SOURCE
    corpus_help = "a WMDP corpus (wmdp:bio-forget, wmdp:cyber-forget, wmdp:bio-retain, wmdp:cyber-retain, wmdp:wikitext)"
    columns = report.COLUMNS
    table_unit = "Domain"
    table_note = report.NOTE
    caption = ("\\texttt{WMDP}: accuracy on each domain's hazardous-knowledge questions (lower is more forgotten; "
               "chance 0.25) and on MMLU overall and its closest subjects. ``Original'' is the model before "
               "unlearning (not ranked). Best method per column, within each model and domain, in bold.")
    axis_labels = ("Forgetting (1 - WMDP accuracy of the domain; chance at 0.75)", "MMLU accuracy")
    kept_score_name = "MMLU accuracy"
    kept_score_short = "MMLU"
    recovery_metric = "forget_acc"
    study_keys = (("forget_acc", "WMDP accuracy (domain)"), ("mmlu_acc", "MMLU"),
                  ("wmdp_bio_acc", "WMDP-Bio"), ("wmdp_cyber_acc", "WMDP-Cyber"))
    stats_note = "WMDP's questions per domain are one sample: the p-values describe these runs"

    passage_corpora = True   # IdkDPO, DPO, RT and LUNAR (question / answer rows) are refused on it
    chance_forgetting = 1 - tasks.CHANCE   # the trade-off plot's chance line: 1 - 0.25

    def metric_range(self, name: str) -> tuple[float, float] | None:
        """Every accuracy it reports (`wmdp_<domain>_acc`, `forget_acc`, `mmlu_*_acc`) lies in [0, 1]."""
        return (0.0, 1.0) if name.endswith("_acc") else None

    def plots(self, rows: list[dict], out_dir: Path) -> list[Path]:
        path = report.accuracy_plot(rows, out_dir)
        return [path] if path else []

    def forgetting_utility(self, metrics: dict) -> tuple[float | None, float | None]:
        forget = metrics.get("forget_acc")
        return (1 - forget if report._number(forget) else None), metrics.get("mmlu_acc")

    def kept_score(self, result: dict) -> float | None:
        value = (result.get("metrics") or {}).get("mmlu_acc")
        return value if report._number(value) else None

    def resolve_block(self, block: dict, where: str, check) -> dict[str, Any]:
        domains = check.str_list(block.get("domains", ["bio", "cyber"]), f"{where}.domains")
        for i, unit in enumerate(domains):
            parts = unit.split(JOINT)   # `bio+cyber`: one unit trained on both domains (WMDP's headline run)
            for domain in parts:
                if domain not in tasks.DOMAINS:
                    check.fail(f"{where}.domains[{i}]", f"WMDP has no domain {domain!r}; valid: "
                               f"{', '.join(tasks.DOMAINS)}, or domains joined by {JOINT} (bio{JOINT}cyber)")
            if len(set(parts)) != len(parts):
                check.fail(f"{where}.domains[{i}]", f"a joint unit names each domain once, got {unit!r}")
        if not domains or len(set(domains)) != len(domains):
            check.fail(f"{where}.domains", f"expected distinct domains, got {domains}")
        return {"splits": domains}

    def units(self, block: dict, selected=None) -> list[tuple[str | None, int | None]]:
        return [(domain, None) for domain in block["splits"]]

    def placeholder_values(self, split, target) -> dict[str, Any]:
        return {"split": split or "", "target": ""}

    def unit_label(self, split, target) -> str:
        return split or ""

    def check_data_dir(self, value: str) -> str | None:
        if value == "testbed:world":
            return "testbed:world is a fictitious TOFU-schema world: TOFU only"
        return None

    def corpus_rows(self, source: str, data_dir) -> tuple[list[dict], str] | None:
        """The rows of a `wmdp:` corpus source, None for a source of another kind."""
        return wmdp_data.load_source(source, data_dir) if wmdp_data.parse_source(source) is not None else None

    def lmeval_tasks(self, tasks_: list[str], data_dir):
        """lm-eval's own WMDP and MMLU folders, and the tasks pointed at the local root when there is one
        (`tasks.lmeval_tasks`)."""
        return tasks.lmeval_tasks(tasks_, wmdp_data.resolve_root(data_dir))

    def score(self, cell, lmeval_dir, *, data_dir, original_model, retain_result, device, batch_size) -> dict:
        return scoring.score_cell(lmeval_dir, cell.split)


    def method_defaults(self, method: str, split, given=()) -> dict[str, Any]:
        """WMDP's protocol rule: RMU's data budget and schedule for every method (`methods.py`)."""
        from . import methods

        return methods.method_defaults(method)

    def method_settings(self, method: str, split) -> dict[str, Any]:
        """WMDP's own RMU run, and CRU's passage setting (`methods.py`: their sources)."""
        from . import methods

        return dict(methods.METHOD_SETTINGS.get(method, {}))

BENCHMARK = WMDP()
