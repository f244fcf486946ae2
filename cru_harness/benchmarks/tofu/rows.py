"""Which rows of TOFU `full` a TOFU config, author or corpus source holds, without reading the data: TOFU lists its
200 authors in blocks of 20 rows; forgetXX is the last XX % of `full`, retainYY the rest, retain_perturbed the first
400 rows, each in `full`'s order (checked against the real files). `tuning:` reads these to refuse a validation unit
that shares an item with a reported one, and a fine-tune that never taught the validation authors."""
from __future__ import annotations

import re

from .data import AUTHOR_ROWS, parse_author_source

FULL_ROWS = 4000
SPACE = "TOFU full"
_PERCENT = re.compile(r"(forget|retain)(\d\d)(_perturbed)?")
_CAP = re.compile(r"(.+)\[(\d*):(\d+)\]")
#: `authors_3-4` (authors 3 to 4's rows of `full`), `not_authors_3-4` (every other row): the `tofu_authors` units
_WINDOW = re.compile(r"(not_)?authors_(\d+)-(\d+)")
#: authors with paraphrased and perturbed answers (`retain_perturbed`: the first 400 rows of `full`)
PERTURBED_AUTHORS = 20


def parse_window(name: str) -> tuple[int, int, bool] | None:
    """`authors_3-4` -> (3, 4, False); `not_authors_3-4` -> (3, 4, True); else None (bounds unchecked)."""
    match = _WINDOW.fullmatch(str(name))
    return (int(match.group(2)), int(match.group(3)), bool(match.group(1))) if match else None


def window_rows(first: int, last: int) -> range:
    """Authors `first`..`last`'s rows of `full` (and of `retain_perturbed`, in the same order)."""
    return range((first - 1) * AUTHOR_ROWS, last * AUTHOR_ROWS)


def config_rows(name: str) -> list[int] | None:
    """The rows of `full` one TOFU config or author source holds, in order; None for one outside `full`
    (holdout, real authors, world facts, a file)."""
    if name == "full":
        return list(range(FULL_ROWS))
    if name == "retain_perturbed":
        return list(range(400))
    if (match := _PERCENT.fullmatch(name)):
        kind, percent = match.group(1), int(match.group(2))
        forget = FULL_ROWS * (percent if kind == "forget" else 100 - percent) // 100
        return list(range(FULL_ROWS - forget, FULL_ROWS)) if kind == "forget" else list(range(FULL_ROWS - forget))
    if (author := parse_author_source(name)) is not None:
        number, others = author
        own = range((number - 1) * AUTHOR_ROWS, number * AUTHOR_ROWS)
        return [row for row in range(FULL_ROWS) if row not in own] if others else list(own)
    if (window := parse_window(name)) is not None:
        own = window_rows(window[0], window[1])
        return [row for row in range(FULL_ROWS) if row not in own] if window[2] else list(own)
    return None


def source_rows(source: str) -> list[int] | None:
    """The rows of `full` a corpus source holds (`retain99[:40] + forget01`: parts joined by ` + `, each maybe cut by
    `[A:B]` / `[:N]`, as `data.corpora.load_corpus_rows` reads them); None when a part is not in `full`."""
    rows: list[int] = []
    for part in str(source).split(" + "):
        part = part.strip()
        cap = _CAP.fullmatch(part)
        base = config_rows(cap.group(1).strip() if cap else part)
        if base is None:
            return None
        if cap:
            base = base[int(cap.group(2) or 0):int(cap.group(3))]
        rows += base
    return rows


def items(rows: list[int] | None) -> frozenset | None:
    """Rows as the items `Benchmark.unit_items` compares across the TOFU benchmarks: (what they index, row)."""
    return None if rows is None else frozenset((SPACE, row) for row in rows)
