"""Training corpora for unlearning (forget / retain sets) from files, TOFU splits or RWKU targets.

A corpus is a list of strings. Question/answer rows are written by the one prompt builder
(`cru_harness.prompts.qa_texts`) when a tokenizer is given: the same text the evaluation scores (the chat
conversation where evaluation uses the chat template), so CRU localizes and routes on what it is evaluated on.
An RWKU cell writes them as the RWKU probe of their file asks (`row_prompt`; rows from elsewhere as the QA probe).
Without a tokenizer they use the plain template `Question: {q}\nAnswer: {a}`.
"""
from __future__ import annotations

from collections.abc import Callable

import os
import re
from pathlib import Path

from ..errors import InputError
from ..prompts import plain_prompt
from .rwku import load_target_file
from .sources import DataSourceError, read_json_records
from .tofu import TOFU_CONFIGS, load_author_rows, load_tofu, parse_author_source



class RowError(DataSourceError, ValueError):
    """A training row without usable question+answer or text (a `ValueError` too, as row errors always were)."""


def format_qa_prompt(question: str) -> str:
    """The plain prompt a model completes with ` {answer}` (`prompts.plain_prompt`, the one builder)."""
    return plain_prompt(question)


def format_qa(question: str, answer: str) -> str:
    """The protocol's plain prompt followed by the answer after one space."""
    return f"{plain_prompt(question)} {answer}"


def row_qa(row: dict, index: int, origin: str = "corpus") -> tuple[str, str]:
    """(question, answer) of a training row, a `text` row as ("", text): the one check every training row
    passes (CRU and the baselines). A null, empty or non-text field is an error naming the row: `answer: null`
    must not be trained on as the text "None"."""
    if not isinstance(row, dict):
        raise RowError(f"{origin} row {index} is not an object with question+answer or text "
                              f"(got {type(row).__name__})")
    if "question" in row and "answer" in row:
        names = ("question", "answer")
    elif "text" in row:
        names = ("text",)
    else:
        raise RowError(
            f"{origin} row {index} has neither `question`+`answer` nor `text` (fields: {', '.join(sorted(row)) or 'none'})"
        )
    values = []
    for name in names:
        value = row[name]
        if value is None:
            raise RowError(f"{origin} row {index}: `{name}` is null")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise RowError(f"{origin} row {index}: `{name}` is not text (got {type(value).__name__})")
        if not str(value).strip():
            raise RowError(f"{origin} row {index}: `{name}` is empty")
        values.append(str(value))
    return ("", values[0]) if len(values) == 1 else (values[0], values[1])


def row_prompt(row: dict) -> dict:
    """The `qa_texts` arguments a row carries: the RWKU probe its file is asked by (`rwku_probe`, set when an RWKU
    probe file is read as a corpus; None otherwise) and an adversarial-attack row's `type`."""
    probe = row.get("rwku_probe")
    return {"probe": probe, "aa_type": str(row.get("type") or "") if probe == "aa" else ""}


def rows_to_texts(rows: list[dict], origin: str, *, tokenizer=None, chat: bool | None = None,
                  preset: str | None = None, family: str | None = None, benchmark: str = "tofu") -> list[str]:
    """`question`+`answer` rows become QA text, `text` rows stay as they are; anything else is an error.

    With a `tokenizer`, QA text is `cru_harness.prompts.qa_texts(...).text` (chat: None = the tokenizer's template
    if it has one; preset / family: the TOFU preset, default open-unlearning; benchmark: whose question format,
    `rwku` with each row's `row_prompt`); without one, `format_qa`."""
    from cru_harness.prompts import DEFAULT_TOFU_PRESET, qa_texts

    texts = []
    for index, row in enumerate(rows):
        question, answer = row_qa(row, index, origin)
        if question and tokenizer is not None:
            texts.append(qa_texts(tokenizer, question, answer, chat=chat, preset=preset or DEFAULT_TOFU_PRESET,
                                  family=family, benchmark=benchmark, **row_prompt(row)).text)
        else:
            texts.append(format_qa(question, answer) if question else answer)
    return texts


def load_corpus_rows(source: str | os.PathLike, data_dir: str | os.PathLike | None = None) -> tuple[list[dict], str]:
    """The rows of a corpus source and a description of where they came from.

    Sources: a JSON/JSONL file, a TOFU config name (`forget10`, `retain90`), LUNAR's single-author TOFU split
    (`author_K`: author K's 20 rows of `full`; `not_author_K`: the other authors' rows), or `rwku:<targets>:<kind>`
    (`rwku:1:passage`, `rwku:1-3:forget_mia`; a probe kind such as `rwku:101-110:neighbor_level2` gives its
    `query` + `answer` rows as question/answer pairs; `rwku:1:pair` / `rwku:1:reject` give RWKU's DPO / RT rows with
    their own `alternate` answer, `rwku.corpus_row`). A trailing `[:N]` keeps the first N rows (`rwku:1:passage[:32]`),
    `[A:B]` rows A to B-1 (`full[0:400]`), so a capped corpus is visible in the source string that results
    record. Sources joined by ` + ` are concatenated in order (`retain99[:40] + forget01`: a reduced TOFU
    fine-tuning set of two retain authors and the forget01 authors).
    """
    parts = [part.strip() for part in str(source).split(" + ")] if " + " in str(source) else [str(source)]
    if len(parts) > 1:
        rows, origins = [], []
        for part in parts:
            if not part:
                raise InputError(f"corpus {source!r}: an empty source between ' + '")
            part_rows, origin = load_corpus_rows(part, data_dir)
            rows.extend(part_rows)
            origins.append(origin)
        return rows, " + ".join(origins)
    source_text = str(source)
    start, stop = 0, None
    cap = re.fullmatch(r"(.+)\[(\d*):(\d+)\]", source_text)
    if cap:
        source_text, start, stop = cap.group(1), int(cap.group(2) or 0), int(cap.group(3))
        if not cap.group(2) and stop < 1:
            raise InputError(f"corpus {source!r}: [:N] needs N >= 1")
        if stop <= start:
            raise InputError(f"corpus {source!r}: [A:B] needs B > A: it keeps rows A to B-1")
    path = Path(source_text).expanduser()
    if path.suffix in (".json", ".jsonl") or path.exists():
        rows, origin = read_json_records(path), str(path)
    elif source_text in TOFU_CONFIGS:
        rows, origin = load_tofu(source_text, data_dir), f"TOFU {source_text}"
    elif (author := parse_author_source(source_text)) is not None:
        rows, origin = load_author_rows(author[0], data_dir, others=author[1]), f"TOFU full {source_text}"
    elif source_text.startswith("rwku:"):
        rows, origin = _rwku_rows(source_text, data_dir)
    else:
        raise InputError(
            f"corpus {source_text!r} is not an existing file, a TOFU config ({', '.join(TOFU_CONFIGS)}), "
            "a TOFU author (author_1, not_author_1) or an RWKU source like rwku:1:passage"
        )
    if not rows:
        raise DataSourceError(f"corpus {origin} is empty")
    if cap:
        if start >= len(rows):
            raise DataSourceError(f"corpus {source!r}: {origin} has {len(rows)} rows, none from row {start} on")
        rows = rows[start:stop]
        origin = f"{origin} rows {start}-{start + len(rows) - 1}"
    for index, row in enumerate(rows):  # every row checked when read, before any model is loaded
        row_qa(row, index, origin)
    return rows, origin


def count_local_rows(source: str, benchmark: str, data_dir: str | os.PathLike | None = None) -> int | None:
    """The rows of a corpus when its data is on this machine, None when it would come from the Hub (a dry run
    counts what a run would train on without downloading anything)."""
    from .. import plugins
    from .sources import resolve_local_dir

    if benchmark in plugins.benchmarks.names():   # a benchmark may read another's folder (tofu_author: TOFU's)
        benchmark = plugins.benchmarks.get(benchmark).data_source or benchmark
    if resolve_local_dir(benchmark, data_dir) is None and not Path(str(source)).expanduser().is_file():
        return None
    return len(load_corpus_rows(source, data_dir)[0])


def training_steps_note(source: str, benchmark: str, data_dir, shape: str, steps: Callable[[int], str],
                        check: Callable[[], object] = lambda: None) -> str:
    """`--dry-run`'s cost of training on a corpus: `steps(rows)`, rows counted from local data only; `shape` (the
    epochs and batch) where they cannot be counted. A problem the run itself would report (`check`, the row
    count) is named here, not raised: the dry run goes on to the other cells."""
    from ..errors import UserError

    try:
        check()
        rows = count_local_rows(source, benchmark, data_dir)
        return f"steps counted when the data is loaded ({shape})" if rows is None else steps(rows)
    except UserError as error:
        return f"steps not counted: {error} ({shape})"


def load_corpus(source: str | os.PathLike, data_dir: str | os.PathLike | None = None, *, tokenizer=None,
                chat: bool | None = None, preset: str | None = None, family: str | None = None,
                benchmark: str = "tofu") -> list[str]:
    """A corpus as texts; sources as for `load_corpus_rows`, formatting as for `rows_to_texts`."""
    rows, origin = load_corpus_rows(source, data_dir)
    return rows_to_texts(rows, origin, tokenizer=tokenizer, chat=chat, preset=preset, family=family,
                         benchmark=benchmark)


def _rwku_rows(source: str, data_dir) -> tuple[list[dict], str]:
    from .rwku import ALTERNATE_KINDS, PROBE_KINDS, corpus_row, parse_targets

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
