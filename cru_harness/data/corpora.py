"""Training corpora for unlearning (forget / retain sets) from files or a benchmark's named corpora.

A corpus is a list of strings. A source that is not a file is read by the benchmark plugin that knows its name
(`Benchmark.corpus_rows`, asked in registry order). Question/answer rows are written by the one prompt builder
(`cru_harness.prompts.qa_texts`) when a tokenizer is given: the same text the evaluation scores (the chat
conversation where evaluation uses the chat template), so CRU localizes and routes on what it is evaluated on. A
row may carry its benchmark's prompt keywords (`row_prompt`: e.g. the probe that asks it). Without a tokenizer they
use the plain template `Question: {q}\nAnswer: {a}`.
"""
from __future__ import annotations

from collections.abc import Callable

import os
import re
from pathlib import Path

from ..errors import InputError
from ..prompts import plain_prompt
from .sources import DataSourceError, read_json_records, resolve_local_dir


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


def row_prompt(row: dict, benchmark: str | None = None) -> dict:
    """The `qa_texts` arguments a row carries, as its benchmark reads them (`Benchmark.prompt_keys`: e.g. the probe
    its file is asked by); {} for a row of no benchmark's. `benchmark`: the cell's (None: every registered one's
    keys, as a row read from a benchmark corpus carries only its own)."""
    from .. import plugins

    found = [plugins.benchmarks.get(benchmark)] if benchmark else list(plugins.benchmarks)
    keys: dict = {}
    for plugin in found:
        keys.update(plugin.prompt_keys(row))
    return keys


def rows_to_texts(rows: list[dict], origin: str, *, tokenizer=None, chat: bool | None = None,
                  preset: str | None = None, family: str | None = None, benchmark: str | None = None) -> list[str]:
    """`question`+`answer` rows become QA text, `text` rows stay as they are; anything else is an error.

    With a `tokenizer`, QA text is `cru_harness.prompts.qa_texts(...).text` (chat: None = the tokenizer's template
    if it has one; preset / family: the TOFU preset, default open-unlearning; benchmark: whose question format, with
    each row's `row_prompt`; None: `qa_texts`'s default); without one, `format_qa`."""
    from cru_harness.prompts import DEFAULT_TOFU_PRESET, qa_texts

    texts = []
    for index, row in enumerate(rows):
        question, answer = row_qa(row, index, origin)
        if question and tokenizer is not None:
            chosen = {"benchmark": benchmark} if benchmark else {}
            texts.append(qa_texts(tokenizer, question, answer, chat=chat, preset=preset or DEFAULT_TOFU_PRESET,
                                  family=family, **chosen, **row_prompt(row, benchmark)).text)
        else:
            texts.append(format_qa(question, answer) if question else answer)
    return texts


def load_corpus_rows(source: str | os.PathLike, data_dir: str | os.PathLike | None = None) -> tuple[list[dict], str]:
    """The rows of a corpus source and a description of where they came from.

    Sources: a JSON/JSONL file, or a corpus name a registered benchmark reads (`Benchmark.corpus_rows`: the
    built-ins' TOFU configs `forget10`, `retain90`; LUNAR's single-author split `author_K`, `not_author_K`;
    `rwku:<targets>:<kind>`, see each plugin). A trailing `[:N]` keeps the first N rows (`rwku:1:passage[:32]`),
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
    elif (found := benchmark_corpus_rows(source_text, data_dir)) is not None:
        rows, origin = found
    else:
        from .. import plugins

        kinds = [plugin.corpus_help for plugin in plugins.benchmarks if plugin.corpus_help]
        raise InputError(f"corpus {source_text!r} is not an existing file, {', '.join(kinds[:-1])}"
                         f"{' or ' if len(kinds) > 1 else ''}{kinds[-1] if kinds else 'a benchmark corpus'}")
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


def benchmark_corpus_rows(source: str, data_dir) -> tuple[list[dict], str] | None:
    """(rows, origin) of the first registered benchmark that reads a corpus named `source`, or None."""
    from .. import plugins

    for plugin in plugins.benchmarks:
        if (found := plugin.corpus_rows(source, data_dir)) is not None:
            return found
    return None


def count_local_rows(source: str, benchmark: str, data_dir: str | os.PathLike | None = None) -> int | None:
    """The rows of a corpus when its data is on this machine, None when it would come from the Hub (a dry run
    counts what a run would train on without downloading anything)."""
    from .. import plugins

    plugin = plugins.benchmarks.get(benchmark)   # its `data` hook: a subclass may read its parent's folder
    local = plugin.data is None or resolve_local_dir(plugin, data_dir) is not None
    if not local and not Path(str(source)).expanduser().is_file():
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
                benchmark: str | None = None) -> list[str]:
    """A corpus as texts; sources as for `load_corpus_rows`, formatting as for `rows_to_texts`."""
    rows, origin = load_corpus_rows(source, data_dir)
    return rows_to_texts(rows, origin, tokenizer=tokenizer, chat=chat, preset=preset, family=family,
                         benchmark=benchmark)
