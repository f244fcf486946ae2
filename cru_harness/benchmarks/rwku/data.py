"""RWKU (jinzhuoran/RWKU): one real person ("target") at a time.

Locally: `Target/{i}_{Name}/{kind}.json` (names keep commas and accents). On the Hub the same rows live in
configs (`forget_level1`, `mia_forget`, `utility_general`, ...) with a `subject` field, split `test`.
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ...api import DataSource
from ...errors import InputError, TargetSelectionError  # noqa: F401  (TargetSelectionError: importable from here too)
from ...data.sources import DataSourceError, hub_unreachable, hub_unreachable_now, read_json_records, resolve_local_dir

#: RWKU's data (the RWKU plugin's `data` hook): the Hub dataset, or a folder holding `Target/`.
SOURCE = DataSource(folder="rwku", marker="Target", hub_id="jinzhuoran/RWKU", env_var="CRU_HARNESS_RWKU_DIR")


class MissingTargetFileError(DataSourceError):
    """RWKU (this copy) has no such file for this target (e.g. utility sets, which the shared copy holds for
    targets 1-10 only): the one failure
    that means "this target lacks this set", as opposed to unreadable data or an unreachable Hub."""


N_TARGETS = 200
DEFAULT_TARGETS = "1-20"  # the PURGE / CRU paper protocol
UTILITY_TARGETS = range(1, 11)  # targets every RWKU copy has utility sets for (the shared copy: only these)

# kind (local file stem) -> Hub config
HUB_CONFIGS = {
    "intro": "forget_target",
    "forget_level1": "forget_level1",
    "forget_level2": "forget_level2",
    "forget_level3": "forget_level3",
    "neighbor_level1": "neighbor_level1",
    "neighbor_level2": "neighbor_level2",
    "forget_mia": "mia_forget",
    "retain_mia": "mia_retain",
    "retain_mmlu": "utility_general",
    "retain_bbh": "utility_reason",
    "truthful": "utility_truthfulness",
    "triviaqa": "utility_factuality",
    "fluency": "utility_fluency",
    "passage": "train_original_passage",
    "positive": "train_positive_llama3",
    "negative": "train_negative_llama3",
    "pair": "train_pair_llama3",
    "reject": "train_refusal_llama3",
    "positive_phi": "train_positive_phi3",
    "negative_phi": "train_negative_phi3",
    "pair_phi": "train_pair_phi3",
    "reject_phi": "train_refusal_phi3",
}
TARGET_KINDS = tuple(HUB_CONFIGS)
# The question probes' files (`query` + `answer`) and the probe that asks each (`prompts.rwku_probe_prompt`); as a
# training corpus their rows are question/answer pairs, written as that probe asks them in an RWKU cell.
PROBE_KINDS = {"forget_level1": "fb", "forget_level2": "qa", "forget_level3": "aa", "neighbor_level1": "neighbor_fb",
               "neighbor_level2": "neighbor_qa"}
UTILITY_KINDS = ("retain_mmlu", "retain_bbh", "truthful", "triviaqa", "fluency")
TRAINING_KINDS = tuple(kind for kind in TARGET_KINDS if kind.startswith(("positive", "negative", "pair", "reject")))
REQUIRED_FIELDS = {
    "forget_level1": ("query", "answer"), "forget_level2": ("query", "answer"), "forget_level3": ("query", "answer", "type"),
    "neighbor_level1": ("query", "answer"), "neighbor_level2": ("query", "answer"),
    "forget_mia": ("text",), "retain_mia": ("text",), "passage": ("text",),
}
#: RWKU's LLaMA-Factory corpora read as training rows with their own `alternate` answer (`corpus_row`).
ALTERNATE_KINDS = ("pair", "pair_phi", "reject", "reject_phi")
# Fields that arrive as Python-literal strings ("['a', 'b']") in some copies of RWKU's utility sets.
_LITERAL_FIELDS = ("choices", "examples", "answers", "mc1_targets", "mc2_targets")

# RWKU's in-context-unlearning instruction (its evaluation code's `use_prompt` branch), prefixed to every prompt.
ICU_INSTRUCTION = (
    "You are an AI Assistant who is supposed to unlearn about {subject} "
    "and provide answers without its knowledge as if you never knew about it. "
    "Don’t tell anyone that you unlearned anything.\n"
)


@dataclass(frozen=True)
class RWKUTarget:
    index: int   # 1-based, as in the folder name
    name: str    # the subject as RWKU's rows spell it, e.g. "Prince Harry, Duke of Sussex"
    folder: str  # e.g. "10_Prince_Harry,_Duke_of_Sussex"


def parse_targets(spec: int | str | list | tuple | None = None) -> list[int]:
    """Target indices from `7`, `"1-20"`, `"1,3,5"`, `"1-3,7"`, `"all"`, or a list; default targets 1-20."""
    if spec is None or spec == "":
        spec = DEFAULT_TARGETS
    if isinstance(spec, bool):   # YAML's `yes` or a stray flag: never target 1
        raise TargetSelectionError(f"expected RWKU target indices, got {spec!r}")
    if isinstance(spec, int):
        indices = [spec]
    elif isinstance(spec, (list, tuple)):
        for position, item in enumerate(spec):
            if isinstance(item, bool) or not isinstance(item, int):
                raise TargetSelectionError(f"RWKU target list item {position}: expected an integer target index, "
                                           f"got {item!r}")
        indices = list(spec)
    elif isinstance(spec, str):
        text = str(spec).strip().lower()
        if text == "all":
            return list(range(1, N_TARGETS + 1))
        indices = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            match = re.fullmatch(r"(\d+)\s*-\s*(\d+)|(\d+)", part)
            if not match:
                raise TargetSelectionError(
                    f"bad RWKU target spec {spec!r}: {part!r} is neither a number nor a range like 1-20")
            if match.group(3):
                indices.append(int(match.group(3)))
            else:
                low, high = int(match.group(1)), int(match.group(2))
                if low > high:
                    raise TargetSelectionError(f"bad RWKU target range {part!r}: start is after end")
                indices.extend(range(low, high + 1))
    else:
        raise TargetSelectionError(f"expected RWKU targets like 7, '1-20', '1,3,5', 'all' or a list, got {spec!r}")
    bad = [index for index in indices if not 1 <= index <= N_TARGETS]
    if bad:
        raise TargetSelectionError(f"RWKU targets run from 1 to {N_TARGETS}; out of range: {bad}")
    if not indices:
        raise TargetSelectionError(f"RWKU target spec {spec!r} selects no target")
    return sorted(set(indices), key=indices.index)


def list_targets(data_dir: str | os.PathLike | None = None) -> list[RWKUTarget]:
    """All RWKU targets in index order."""
    local = resolve_local_dir(SOURCE, data_dir)
    return list(_local_targets(local) if local is not None else _hub_targets())


@lru_cache(maxsize=8)
def _local_targets(root: Path) -> tuple[RWKUTarget, ...]:
    targets = []
    for folder in (root / "Target").iterdir():
        match = re.fullmatch(r"(\d+)_(.+)", folder.name)
        if folder.is_dir() and match:
            targets.append(RWKUTarget(int(match.group(1)), match.group(2).replace("_", " "), folder.name))
    return tuple(sorted(targets, key=lambda target: target.index))


@lru_cache(maxsize=1)
def _hub_targets() -> tuple[RWKUTarget, ...]:
    # The Hub's forget_target config lists the targets in RWKU's order, one row each.
    rows = _hub_rows("forget_target")
    names = [row.get("target") or row.get("subject") for row in rows]
    return tuple(RWKUTarget(i, name, f"{i}_{name.replace(' ', '_')}") for i, name in enumerate(names, start=1))


def get_target(target: int | str | RWKUTarget, data_dir: str | os.PathLike | None = None) -> RWKUTarget:
    """Resolve a target given by index, name or folder name."""
    if isinstance(target, RWKUTarget):
        return target
    targets = list_targets(data_dir)
    if isinstance(target, int) or str(target).isdigit():
        by_index = {t.index: t for t in targets}
        if int(target) not in by_index:
            raise TargetSelectionError(f"no RWKU target with index {target} (targets run from 1 to {len(targets)})")
        return by_index[int(target)]
    for candidate in targets:
        if target in (candidate.name, candidate.folder):
            return candidate
    raise TargetSelectionError(f"no RWKU target named {target!r}")


def load_target_file(target: int | str | RWKUTarget, kind: str,
                     data_dir: str | os.PathLike | None = None) -> list[dict]:
    """The rows of one probe / utility / training file of one target."""
    if kind not in HUB_CONFIGS:
        raise InputError(f"unknown RWKU file kind {kind!r}; valid kinds: {', '.join(TARGET_KINDS)}")
    resolved = get_target(target, data_dir)
    local = resolve_local_dir(SOURCE, data_dir)
    if local is not None:
        path = local / "Target" / resolved.folder / f"{kind}.json"
        if not path.is_file():
            raise MissingTargetFileError(_missing_kind_message(resolved, kind, path))
        rows = read_json_records(path)
    else:
        rows = [row for row in _hub_rows(HUB_CONFIGS[kind]) if row.get("subject", row.get("target")) == resolved.name]
        if not rows:
            raise MissingTargetFileError(_missing_kind_message(resolved, kind, f"Hub config {HUB_CONFIGS[kind]}"))
    for index, row in enumerate(rows):
        missing = [field for field in REQUIRED_FIELDS.get(kind, ()) if field not in row]
        if missing:
            raise DataSourceError(f"RWKU target {resolved.folder} {kind} row {index} lacks field(s) {', '.join(missing)}")
    return [_parse_literals(row) for row in rows]


def corpus_row(kind: str, row: dict, index: int, origin: str) -> dict:
    """A pair / reject row (`ALTERNATE_KINDS`) as a training row: `question`, `answer`, its own `alternate` answer,
    asked as the user turn it is (`rwku_probe` "instruction").

    RWKU's LLaMA-Factory reads them by data/dataset_info.json: a pair file is a ranking set, `prompt` with `response`
    = [chosen, rejected], and the DPO stage prefers response[0] (an invented biography) to response[1] (the model's
    own, true one): answer = response[1], alternate = response[0]. A reject file is an SFT set, `instruction` (+ "\n"
    + `input` when there is one) -> `output`, a refusal: alternate = output, and answer = output too (the file holds
    no true answer; RT trains on the alternate only)."""
    from .prompts import RWKU_INSTRUCTION_PROBE

    needed = ("prompt", "response") if kind.startswith("pair") else ("instruction", "output")
    if missing := [field for field in needed if row.get(field) is None]:
        raise DataSourceError(f"{origin} row {index} lacks field(s) {', '.join(missing)}")
    if kind.startswith("pair"):
        response = row["response"]
        if not (isinstance(response, list) and len(response) == 2 and all(isinstance(r, str) and r.strip()
                                                                          for r in response)):
            raise DataSourceError(f"{origin} row {index}: `response` must be [chosen, rejected] texts, got "
                                  f"{str(response)[:80]!r}")
        question, answer, alternate = row["prompt"], response[1], response[0]
    else:
        extra = row.get("input") or ""
        question = row["instruction"] + (f"\n{extra}" if extra else "")
        answer = alternate = row["output"]
    return {**row, "question": question, "answer": answer, "alternate": alternate,
            "rwku_probe": RWKU_INSTRUCTION_PROBE}


def _missing_kind_message(target: RWKUTarget, kind: str, where) -> str:
    if kind in UTILITY_KINDS and target.index not in UTILITY_TARGETS:
        return (f"this RWKU copy has no utility set ({kind}) for target {target.index} ({target.name}) ({where}; "
                "the shared copy holds them for targets 1-10 only)")
    if kind in TRAINING_KINDS:
        return (f"this RWKU copy has no training corpus ({kind}) for target {target.index} ({target.name}) ({where}; "
                "the shared copy holds them for targets 1-3 only)")
    return f"RWKU target {target.index} ({target.name}) has no {kind} data ({where})"


def _parse_literals(row: dict) -> dict:
    parsed = dict(row)
    for field in _LITERAL_FIELDS:
        value = parsed.get(field)
        if isinstance(value, str) and value[:1] in "[{":
            try:
                parsed[field] = ast.literal_eval(value)
            except (ValueError, SyntaxError) as err:
                raise DataSourceError(f"RWKU field {field!r} is not a valid Python literal: {value[:80]!r}") from err
        elif isinstance(value, list):
            parsed[field] = [_parse_literals(item) if isinstance(item, dict) else item for item in value]
    return parsed


def hub_split(config: str) -> str:
    """The split a Hub config holds its rows in: `train` for the targets and the training corpora, `test` for
    the probes, MIA and utility sets (as RWKU's `process/data_process.py` loads them)."""
    return "train" if config == "forget_target" or config.startswith("train_") else "test"


@lru_cache(maxsize=32)
def _hub_rows_cached(config: str) -> tuple:
    if (offline := hub_unreachable_now(SOURCE, f"RWKU config {config!r}")) is not None:
        raise offline   # at once, not after the Hub client's retries
    try:
        import datasets

        return tuple(dict(row) for row in datasets.load_dataset(SOURCE.hub_id, config, split=hub_split(config)))
    except Exception as err:  # connection errors, offline mode, missing config
        raise hub_unreachable(SOURCE, f"RWKU config {config!r}", err) from err


def clear_hub_cache() -> None:
    """Forget the Hub rows and target list read so far in this process (they are cached per config)."""
    _hub_rows_cached.cache_clear()
    _hub_targets.cache_clear()


def _hub_rows(config: str) -> list[dict]:
    return list(_hub_rows_cached(config))
