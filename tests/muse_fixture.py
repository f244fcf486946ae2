"""A small fictitious MUSE corpus in MUSE's exact schema (the Hub's configs, splits and fields), written by the tests.

`write_muse_fixture(root)` writes `root/news/` and `root/books/` in the Hub's file layout
(`<config>/<split>-00000-of-00001.parquet`), or MUSE's own `data/<corpus>/<config>/<split>.json` layout with
`layout="json"`. Every text is invented here: none of MUSE's articles or books is ever committed.
"""
from __future__ import annotations

import json
from pathlib import Path

_PLACES = ["Velmora", "Ostrick", "Quandle Bay", "Tarnwick", "Elsmere Vale", "Brightholm", "Corvan", "Duskford"]
_PEOPLE = ["Mira Kestrel", "Tobin Ashgrove", "Lena Varro", "Jorund Pell", "Ada Quill", "Silas Fenwright",
           "Noor Halvorsen", "Pim Alder"]
_THINGS = ["a floating library", "the lantern festival", "a copper bridge", "the tide clock", "a glass orchard",
           "the river ferry", "a moth museum", "the salt market"]


def _article(i: int, tag: str) -> str:
    place, person, thing = _PLACES[i % 8], _PEOPLE[(i * 3) % 8], _THINGS[(i * 5) % 8]
    return (f"{place} ({tag} {i}): {person} opened {thing} on Tuesday, the town council said. "
            f"Residents of {place} queued from dawn to see {thing}, which {person} had planned for nine years. "
            f"The council expects {thing} to draw visitors to {place} all summer.")


def _qa(i: int) -> dict:
    return {"question": f"Who opened {_THINGS[(i * 5) % 8]} in {_PLACES[i % 8]}?", "answer": _PEOPLE[(i * 3) % 8]}


def fixture_rows(corpus: str, n: int = 6) -> dict[tuple[str, str], list[dict]]:
    """(config, split) -> rows, as the Hub datasets hold them."""
    tag = corpus.upper()
    forget = [_article(i, tag) for i in range(n)]
    holdout = [_article(i + 40, tag + "-H") for i in range(n)]
    retain1 = [_article(i + 80, tag + "-R") for i in range(n)]
    retain2 = [_article(i + 120, tag + "-R2") for i in range(n)]
    rows: dict[tuple[str, str], list[dict]] = {
        ("raw", "forget"): [{"text": t} for t in forget],
        ("raw", "holdout"): [{"text": t} for t in holdout],
        ("raw", "retain1"): [{"text": t} for t in retain1],
        ("raw", "retain2"): [{"text": t} for t in retain2],
        ("verbmem", "forget"): [{"prompt": t[:40], "gt": t[40:]} for t in forget[:4]],
        ("knowmem", "forget_qa"): [_qa(i) for i in range(1, 5)],
        ("knowmem", "forget_qa_icl"): [_qa(0), _qa(5)],
        ("knowmem", "retain_qa"): [_qa(i + 80) for i in range(1, 5)],
        ("knowmem", "retain_qa_icl"): [_qa(80), _qa(85)],
        ("privleak", "forget"): [{"text": t} for t in forget],
        ("privleak", "retain"): [{"text": t} for t in retain2],
        ("privleak", "holdout"): [{"text": t} for t in holdout],
    }
    # as MUSE's: fold 1 of both is the raw forget split; scal's forget sets grow, each holding the one before;
    # sust's later requests are new texts
    extra = [_article(160 + j, tag + "-X") for j in range(3)]
    for k in range(1, 5):
        rows[("scal", f"forget_{k}")] = [{"text": t} for t in forget + extra[:k - 1]]
        sust = forget if k == 1 else [_article(200 + 10 * k + j, f"{tag}-S{k}") for j in range(2)]
        rows[("sust", f"forget_{k}")] = [{"text": t} for t in sust]
    return rows


def write_muse_fixture(root: Path, *, layout: str = "hub", corpora=("news", "books")) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(root)
    for corpus in corpora:
        for (config, split), rows in fixture_rows(corpus).items():
            folder = root / corpus / config
            folder.mkdir(parents=True, exist_ok=True)
            if layout == "hub":
                pq.write_table(pa.Table.from_pylist(rows), folder / f"{split}-00000-of-00001.parquet")
            else:   # MUSE's load_data.py: text configs as lists of strings
                value = [r["text"] for r in rows] if list(rows[0]) == ["text"] else rows
                (folder / f"{split}.json").write_text(json.dumps(value), encoding="utf-8")
    return root
