"""The report's "Tuning" section: the records `runner.tuning` saves in a run directory (`tuning/<model>.json`):
the rule as written in the config, each tuned entry's grid with every validation cell's score, and the choice. The
validation cells stay out of the leaderboards (`tuning_cell_hashes`): they are how settings were chosen, not
results."""
from __future__ import annotations

from pathlib import Path

from ..store import read_recorded_json
from .stats import is_number

TUNING_DIR = "tuning"


def tuning_records(dirs) -> list[dict]:
    return [read_recorded_json(path, "the tuning record")
            for directory in dirs for path in sorted((Path(directory) / TUNING_DIR).glob("*.json"))]


def tuning_cell_hashes_of(record: dict) -> set[str]:
    """A tuning record's validation cells (and its validation Originals)."""
    return {*record["original"]["cells"],
            *(cell["hash"] for method in record["methods"].values() for row in method["settings"]
              for cell in row["cells"])}


def tuning_cell_hashes(dirs) -> set[str]:
    """The validation cells of the run directories' tuning records (and their validation Originals)."""
    return set().union(*(tuning_cell_hashes_of(record) for record in tuning_records(dirs)))


def pending_tuning(dirs, plans: list[dict], loaded: list[dict]) -> tuple[list[str], set[str]]:
    """A run whose plan has `tuning:` but whose rule has not chosen yet (no record: some validation cell has no
    result): a line saying that its tuned entries' reported cells are not planned yet, so that the plan's owed cells
    do not read as the whole run; and the hashes of the validation cells it holds (those of a benchmark only the
    validation block names), which stay out of the leaderboards as a record's do."""
    if tuning_records(dirs):
        return [], set()
    blocks = [plan.get("config") or {} for plan in plans if (plan.get("config") or {}).get("tuning")]
    if not blocks:
        return [], set()
    validating: set[str] = set()
    tuned: list[str] = []
    for config in blocks:
        block = config["tuning"]
        validating |= set(block.get("validation") or {}) - set(config.get("benchmarks") or {})
        tuned += [str(label) for label in block.get("methods") or [] if str(label) not in tuned]
    which = ", ".join(tuned) if tuned else "every entry with a default grid"
    held = [r for r in loaded if r.get("benchmark") in validating and r.get("hash")]
    lines = [f"**The tuning rule has not chosen yet** (`tuning:`): a validation cell still has no result. The tuned "
             f"entries ({which}) are planned only once it has chosen, so their reported cells are owed beyond the "
             f"planned ones. The {len(held)} validation cell(s) computed so far, which are how settings will be "
             "chosen, not results:", ""]
    if held:
        from .. import plugins

        forgetting, utility = plugins.benchmarks.get(held[0]["benchmark"]).axis_labels
        lines += [f"| Cell | Hash | {forgetting} | {utility} | FQ |", "|---|---|---:|---:|---:|"]
        for result in held:
            scores = plugins.benchmarks.get(result["benchmark"]).forgetting_utility(result.get("metrics") or {})
            lines.append(f"| {result.get('label')} ({result.get('unit') or result.get('split')}) | {result['hash']} "
                         f"| {_number(scores[0])} | {_number(scores[1])} | "
                         f"{_number((result.get('metrics') or {}).get('forget_quality'))} |")
        lines += [*_refinetuned(held), ""]
    return lines, {r["hash"] for r in held}


def _refinetuned(results: list[dict]) -> list[str]:
    """The validation cells that started from a fine-tuned checkpoint made again with other weights (another
    machine's rounding), named as the leaderboards name such reported cells."""
    # here, not at the top: runner.tuning imports this module for TUNING_DIR, and tables pulls in the metrics
    from .tables import refinetuned_notes

    return [f"- Validation: {note}." for note in refinetuned_notes(results)]


def _number(value) -> str:
    return f"{value:.4f}" if is_number(value) else "—"


def _setting(setting: dict) -> str:
    return ", ".join(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
                     for key, value in setting.items())


def tuning_markdown(dirs, loaded: list[dict] = ()) -> list[str]:
    """One "Tuning" block per record: the rule, the validation unit, and per tuned entry its grid's scores (and,
    from the `loaded` results, how many validation cells started from a fine-tuning re-run with other weights)."""
    lines: list[str] = []
    for record in tuning_records(dirs):
        own = tuning_cell_hashes_of(record)
        forgetting, utility = record["axes"]
        floor = record["utility_ratio"] * record["original"]["utility"]
        lines += [f"## Tuning ({record['model']})", "",
                  f"Rule, written in the config before any result: `{record['rule']}`: {record['rule_text']} "
                  f"(r = {record['utility_ratio']:g}); {record['ties']}; if {record['fallback']}.", "",
                  f"Validation: {', '.join(record['units'])}, seeds {', '.join(map(str, record['seeds']))}; no item "
                  f"shared with a reported unit. The Original's utility there: {_number(record['original']['utility'])}"
                  f" (the floor: {_number(floor)}). Scores are means over the validation cells; a setting with a "
                  "failed cell has none. The reported cells of each entry run at its chosen setting.", "",
                  f"| Entry | Setting | {forgetting} | {utility} | FQ | Keeps utility | Cells | Chosen |",
                  "|---|---|---:|---:|---:|---|---|---|"]
        for label, method in record["methods"].items():
            for index, row in enumerate(method["settings"]):
                cells = ", ".join(f"{cell['hash']} ({cell['status']})" for cell in row["cells"])
                lines.append(f"| {label} | {_setting(row['setting'])} | {_number(row['forgetting'])} | "
                             f"{_number(row['utility'])} | {_number(row['forget_quality'])} | "
                             f"{'yes' if row['qualifies'] else 'no'} | {cells} | "
                             f"{'**chosen**' if index == method['chosen_index'] else ''} |")
        lines.append("")
        lines += [f"- {label}: {_setting(method['chosen'])} ({method['reason']}); grid: {method['source']}; budget: "
                  f"{method['budget']}" for label, method in record["methods"].items()]
        lines += [*_refinetuned([r for r in loaded if r.get("hash") in own]), ""]
    return lines
