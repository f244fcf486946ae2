"""WMDP's data: where it lives (the Hub, or a local root) and its training corpora as text rows.

Hub datasets (WMDP's README and rmu/utils.py; open-unlearning's configs/data/datasets/WMDP_*.yaml):

| corpus source | Hub dataset | config, split | access |
|---|---|---|---|
| `wmdp:bio-forget` | cais/wmdp-bio-forget-corpus | default, train | gated: request access on its page |
| `wmdp:cyber-forget` | cais/wmdp-corpora | cyber-forget-corpus, train | open |
| `wmdp:bio-retain` | cais/wmdp-corpora | bio-retain-corpus, train | open |
| `wmdp:cyber-retain` | cais/wmdp-corpora | cyber-retain-corpus, train | open |
| `wmdp:wikitext` | Salesforce/wikitext | wikitext-2-raw-v1, test | open (RMU's retain corpus) |

WMDP publishes no chemistry corpus: a `chem` cell trains on corpora its config names (a JSON / JSONL file of
`text` rows). As rmu/utils.py's `get_data`, a row is kept when its text is longer than 50 characters (its
`min_len`), which drops wikitext's blank lines and headings. rmu/utils.py reads the cyber corpora's JSON lines as
raw strings (`{"text": ...}` and all); the `text` field is read here, as open-unlearning's `PretrainingDataset` does.

A local root (`data_dir`, `CRU_HARNESS_WMDP_DIR`, or `wmdp/` under `CRU_HARNESS_DATA_DIR`) holds each dataset
as `huggingface-cli download <repo> --repo-type dataset --local-dir <root>/<folder>` leaves it: `wmdp/`, `mmlu/`,
`wmdp-corpora/`, `wmdp-bio-forget-corpus/`, `wikitext/` (a folder may also hold plain `<config>.jsonl` files).

A joint source (`wmdp:bio+cyber-forget`, `wmdp:bio+cyber-retain`: WMDP's headline run trains bio and cyber
together) reads each domain's corpus, tags every row with its `domain` and interleaves the domains row by row
(bio 0, cyber 0, bio 1, ...), so a cap `[:N]` keeps N/2 passages of each. RMU regroups the rows by tag into WMDP's
alternating batches (`baselines.data.DomainAlternatingDataset`); the other methods train on them as one corpus.
"""
from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ...api import DataSource
from ...data.sources import ENV_DATA_DIR, DataSourceError, resolve_local_dir
from ...errors import InputError

ENV_DIR = "CRU_HARNESS_WMDP_DIR"
#: Rows of this many characters or fewer are dropped (rmu/utils.py get_data's `min_len`).
MIN_CHARS = 50
#: A WMDP root: the folder `wmdp/` under a data root, marked by the evaluation's own data (cais/wmdp as `wmdp/`).
SOURCE = DataSource(folder="wmdp", marker="wmdp", hub_id="cais/wmdp", env_var=ENV_DIR)


@dataclass(frozen=True)
class Corpus:
    repo: str
    config: str | None
    split: str
    folder: str          # the dataset's folder under a local root
    gated: bool = False

    @property
    def page(self) -> str:
        return f"https://huggingface.co/datasets/{self.repo}"


CORPORA = {
    "bio-forget": Corpus("cais/wmdp-bio-forget-corpus", None, "train", "wmdp-bio-forget-corpus", gated=True),
    "cyber-forget": Corpus("cais/wmdp-corpora", "cyber-forget-corpus", "train", "wmdp-corpora"),
    "bio-retain": Corpus("cais/wmdp-corpora", "bio-retain-corpus", "train", "wmdp-corpora"),
    "cyber-retain": Corpus("cais/wmdp-corpora", "cyber-retain-corpus", "train", "wmdp-corpora"),
    "wikitext": Corpus("Salesforce/wikitext", "wikitext-2-raw-v1", "test", "wikitext"),
}
#: The local folders of the evaluation's Hub datasets (lm-eval's tasks read them; `tasks.dataset_folder`).
EVAL_DATASETS = {"wmdp": "cais/wmdp", "mmlu": "cais/mmlu"}
SOURCE_RE = re.compile(r"wmdp:(?P<name>[a-z0-9+-]+)(?:\[(?P<start>\d*):(?P<stop>\d+)\])?")
_SUFFIXES = (".parquet", ".jsonl", ".json")
#: A joint corpus: two or more domains joined by `+`, then the kind (`bio+cyber-forget`).
JOINT_RE = re.compile(r"(?P<domains>[a-z]+(?:\+[a-z]+)+)-(?P<kind>forget|retain)")


def joint_parts(name: str) -> list[tuple[str, str]] | None:
    """[(domain, corpus name)] of a joint corpus name (`bio+cyber-forget`), None for a single corpus's name."""
    match = JOINT_RE.fullmatch(name)
    if match is None:
        return None
    return [(domain, f"{domain}-{match.group('kind')}") for domain in match.group("domains").split("+")]


def layout_help() -> str:
    evaluation = ", ".join(f"{folder}/ ({repo})" for folder, repo in EVAL_DATASETS.items())
    corpora = ", ".join(sorted({f"{c.folder}/ ({c.repo})" for c in CORPORA.values()}))
    return (f"a folder holding {evaluation} and the corpora's {corpora}, each as `huggingface-cli download <repo> "
            f"--repo-type dataset --local-dir <root>/<folder>` leaves it")


def resolve_root(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local WMDP root, or None for the Hub (`data.sources.resolve_local_dir` with `SOURCE`): `data_dir` (the
    root itself, or a folder holding it as `wmdp/`), `CRU_HARNESS_WMDP_DIR`, then `wmdp/` under
    `CRU_HARNESS_DATA_DIR`. A folder given that holds no WMDP data is an error, never a fall-back to the Hub."""
    return resolve_local_dir(SOURCE, data_dir)


def parse_source(source: str) -> tuple[str, int, int | None] | None:
    """(corpus name, first row, end row or None) of a `wmdp:<name>` source with an optional `[:N]` / `[A:B]` cap
    (`wmdp:cyber-forget[:600]`: its first 600 rows); None for a source of another kind. An unknown name is an
    error listing WMDP's corpora (chemistry has none: WMDP publishes no chemistry corpus)."""
    if not source.startswith("wmdp:"):
        return None
    match = SOURCE_RE.fullmatch(source)
    parts = joint_parts(match.group("name")) if match else None
    if parts is not None and len({d for d, _ in parts}) != len(parts):
        raise InputError(f"corpus {source!r}: a joint corpus names each domain once")
    if not match or (match.group("name") not in CORPORA and not (parts and all(n in CORPORA for _, n in parts))):
        known = ", ".join("wmdp:" + n for n in CORPORA)
        if source.startswith("wmdp:chem") or (parts and any(d == "chem" for d, _ in parts)):
            raise InputError(f"corpus {source!r}: WMDP publishes no chemistry corpus; name a JSON / JSONL file of "
                             f"`text` rows as forget_corpus (WMDP's corpora: {known})")
        raise InputError(f"corpus {source!r}: WMDP's corpora are {known} (or domains joined by +, as "
                         f"wmdp:bio+cyber-forget), optionally capped as [:N] or [A:B]")
    start, stop = int(match.group("start") or 0), match.group("stop")
    stop = int(stop) if stop is not None else None
    if stop is not None and stop <= start:
        raise InputError(f"corpus {source!r}: [A:B] needs B > A: it keeps rows A to B-1")
    return match.group("name"), start, stop


def load_source(source: str, data_dir: str | os.PathLike | None = None) -> tuple[list[dict], str]:
    """The rows of a `wmdp:` corpus source (`parse_source`), capped as it says."""
    parsed = parse_source(source)
    if parsed is None:
        raise InputError(f"corpus {source!r} is not a WMDP source (wmdp:<corpus>)")
    name, start, stop = parsed
    rows, origin = load_corpus_rows(name, data_dir)
    if start or stop is not None:
        if start >= len(rows):
            raise DataSourceError(f"corpus {source!r}: {origin} has {len(rows)} rows, none from row {start} on")
        rows = rows[start:stop]
        origin = f"{origin} rows {start}-{start + len(rows) - 1}"
    return rows, origin


def _local_files(root: Path, corpus: Corpus) -> list[Path]:
    """The files of a corpus under a local root: a Hub snapshot's `<config>/<split>-*.parquet` (or `.jsonl`), or
    `<config>.jsonl` beside the others; a corpus without configs: its folder's `<split>*` files, else every file."""
    folder = root / corpus.folder
    if not folder.is_dir():
        raise DataSourceError(f"the local WMDP root {root} has no {corpus.folder}/ ({corpus.repo}); expected "
                              f"{layout_help()}")
    sub = folder / corpus.config if corpus.config else folder
    patterns = [(sub, f"{corpus.split}*"), (sub, "*")]
    if corpus.config:
        patterns.append((folder, f"{corpus.config}*"))
    for place, pattern in patterns:
        files = sorted(p for suffix in _SUFFIXES for p in place.glob(pattern + suffix))
        if files:
            return files
    raise DataSourceError(f"no {corpus.config or corpus.repo} {corpus.split} files ({', '.join(_SUFFIXES)}) under "
                          f"{folder}")


def _read_files(files: list[Path]):
    import datasets

    builder = "parquet" if files[0].suffix == ".parquet" else "json"
    return datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train")


def _read_hub(corpus: Corpus):
    import datasets

    try:
        return datasets.load_dataset(corpus.repo, corpus.config, split=corpus.split)
    except Exception as err:   # datasets raises many types for an unreachable / refused Hub
        if corpus.gated and ("gated" in str(err).lower() or type(err).__name__ == "GatedRepoError"):
            raise DataSourceError(
                f"{corpus.repo} is gated: request access at {corpus.page} and log in (huggingface-cli login), or "
                f"put a copy in <root>/{corpus.folder}/ and point data_dir (or {ENV_DIR}) at <root>") from None
        raise DataSourceError(
            f"could not load {corpus.repo} ({corpus.config or 'default'}, {corpus.split}) from the Hugging Face Hub: "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}. Point data_dir (or {ENV_DIR}) "
            f"at a local WMDP root: {layout_help()}") from None


def load_corpus_rows(name: str, data_dir: str | os.PathLike | None = None) -> tuple[list[dict], str]:
    """A WMDP corpus (`CORPORA`) as `{"text": ...}` rows, with where they came from. Rows of `MIN_CHARS`
    characters or fewer are dropped (rmu/utils.py). A joint name (`joint_parts`): each domain's rows tagged
    `{"text": ..., "domain": ...}`, interleaved row by row in the order the name gives the domains."""
    if (parts := joint_parts(name)) is not None:
        loaded = [(domain, *load_corpus_rows(part, data_dir)) for domain, part in parts]
        tagged = [[{**row, "domain": domain} for row in rows] for domain, rows, _ in loaded]
        rows = [row for group in itertools.zip_longest(*tagged) for row in group if row is not None]
        return rows, " + ".join(origin for _, _, origin in loaded)
    corpus = CORPORA[name]
    root = resolve_root(data_dir)
    if root is None:
        table, origin = _read_hub(corpus), f"{corpus.repo} {corpus.config or ''} {corpus.split}".replace("  ", " ")
    else:
        table, origin = _read_files(_local_files(root, corpus)), f"{root / corpus.folder} ({corpus.repo})"
    if "text" not in table.column_names:
        raise DataSourceError(f"{origin} has no `text` column (columns: {', '.join(table.column_names)})")
    rows = [{"text": text} for text in table["text"] if isinstance(text, str) and len(text) > MIN_CHARS]
    if not rows:
        raise DataSourceError(f"{origin} has no text longer than {MIN_CHARS} characters")
    return rows, f"WMDP {name}: {origin}"
