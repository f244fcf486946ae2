"""MUSE's data: the Hub datasets `muse-bench/MUSE-News` and `muse-bench/MUSE-Books`, or a local copy in the Hub's
layout.

A corpus has configs, each with named splits (MUSE's `load_data.py` at fcd6651 reads the same ones):

| config | splits | fields |
|---|---|---|
| raw | forget, holdout, retain1, retain2 | text |
| verbmem | forget | prompt, gt |
| knowmem | forget_qa, retain_qa, forget_qa_icl, retain_qa_icl | question, answer |
| privleak | forget, retain, holdout | text |
| scal | forget_1 .. forget_4 (News) | text |
| sust | forget_1 .. forget_4 (News) | text |

A local copy holds `<config>/<split>-00000-of-00001.parquet` (the Hub's files: a `snapshot_download` of the
dataset), or `<config>/<split>.json` (MUSE's own `data/<corpus>/` layout from `load_data.py`: a JSON list of rows, or
of strings for the text configs). Where: `data_dir` (the corpus folder, or a folder holding `news/` and `books/`,
`MUSE-News/` and `MUSE-Books/`, or `muse/news`...), else `CRU_HARNESS_MUSE_DIR`, else `CRU_HARNESS_DATA_DIR`'s
`muse/`, else the Hub.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from cru_harness.api import DataSource
from cru_harness.data.sources import ENV_DATA_DIR, DataSourceError
from cru_harness.errors import InputError

CORPORA = ("news", "books")
HUB_IDS = {"news": "muse-bench/MUSE-News", "books": "muse-bench/MUSE-Books"}
#: MUSE's published models per corpus (muse_bench README; open-unlearning's `reference_model_path`).
TARGET_MODELS = {"news": "muse-bench/MUSE-News_target", "books": "muse-bench/MUSE-Books_target"}
RETRAIN_MODELS = {"news": "muse-bench/MUSE-News_retrain", "books": "muse-bench/MUSE-Books_retrain"}
ENV_MUSE_DIR = "CRU_HARNESS_MUSE_DIR"
#: The runner's view of a local copy (provenance, dry-run row counts): a `muse/` folder holding `news/` (and
#: `books/`), as MUSE's load_data.py writes `data/`. The loaders below also take one corpus's folder.
SOURCE = DataSource(folder="muse", marker="news", hub_id=HUB_IDS["news"], env_var=ENV_MUSE_DIR)

FOLDS = tuple(f"forget_{k}" for k in range(1, 5))
SPLITS: dict[str, tuple[str, ...]] = {
    "raw": ("forget", "holdout", "retain1", "retain2"),
    "verbmem": ("forget",),
    "knowmem": ("forget_qa", "retain_qa", "forget_qa_icl", "retain_qa_icl"),
    "privleak": ("forget", "retain", "holdout"),
    "scal": FOLDS,
    "sust": FOLDS,
}
FIELDS: dict[str, tuple[str, ...]] = {
    "raw": ("text",), "verbmem": ("prompt", "gt"), "knowmem": ("question", "answer"), "privleak": ("text",),
    "scal": ("text",), "sust": ("text",),
}


def check_corpus(corpus: str) -> str:
    name = str(corpus).strip().lower()
    if name not in CORPORA:
        raise InputError(f"unknown MUSE corpus {corpus!r}; expected one of {', '.join(CORPORA)}")
    return name


def _hub_folder(corpus: str) -> str:
    return HUB_IDS[corpus].split("/")[1]


def _is_corpus_dir(path: Path) -> bool:
    return path.is_dir() and any((path / config).is_dir() for config in SPLITS)


def resolve_local_dir(corpus: str, data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local folder of one corpus, or None (read the Hub). A folder given that holds no copy is an error."""
    corpus = check_corpus(corpus)
    if data_dir:
        origin, raw = "data_dir", str(data_dir)
    elif os.environ.get(ENV_MUSE_DIR):
        origin, raw = ENV_MUSE_DIR, os.environ[ENV_MUSE_DIR]
    elif os.environ.get(ENV_DATA_DIR) and (Path(os.environ[ENV_DATA_DIR]) / "muse").is_dir():
        origin, raw = ENV_DATA_DIR, str(Path(os.environ[ENV_DATA_DIR]) / "muse")
    else:
        return None
    path = Path(raw).expanduser()
    if not path.is_dir():
        raise DataSourceError(f"{origin}={raw} is not a directory")
    # a root holding the corpora first; the folder itself only when it is one corpus's copy
    for folder in (path / corpus, path / _hub_folder(corpus), path / "muse" / corpus, path):
        if _is_corpus_dir(folder):
            return folder
    raise DataSourceError(
        f"{origin}={raw} holds no MUSE {corpus} data: expected {', '.join(SPLITS)} folders in it or in {corpus}/ "
        f"(or {_hub_folder(corpus)}/) below it")


def load_split(corpus: str, config: str, split: str, data_dir: str | os.PathLike | None = None) -> list[dict]:
    """The rows of one split (dicts with `FIELDS[config]`), from the local copy or the Hub."""
    corpus = check_corpus(corpus)
    if config not in SPLITS:
        raise InputError(f"unknown MUSE config {config!r}; expected one of {', '.join(SPLITS)}")
    if split not in SPLITS[config]:
        raise InputError(f"MUSE {config} has no split {split!r}; expected one of {', '.join(SPLITS[config])}")
    local = resolve_local_dir(corpus, data_dir)
    if local is not None:
        rows, where = _load_local(local, config, split), str(local)
    else:
        rows, where = _load_hub(corpus, config, split), HUB_IDS[corpus]
    return _checked(rows, corpus, config, split, where)


def _load_local(folder: Path, config: str, split: str) -> list[dict]:
    parquet = sorted((folder / config).glob(f"{split}-*.parquet"))
    if parquet:
        import pyarrow.parquet as pq   # comes with `datasets`

        return [row for path in parquet for row in pq.read_table(path).to_pylist()]
    path = folder / config / f"{split}.json"
    if not path.is_file():
        raise DataSourceError(f"MUSE data file missing: {folder / config}/{split}-*.parquet (the Hub's layout) "
                              f"or {path}")
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataSourceError(f"{path} is not a UTF-8 JSON file: {err}") from None
    return [{"text": row} if isinstance(row, str) else row for row in rows] if isinstance(rows, list) else rows


def hub_offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
               for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


_NETWORK_ERRORS = {"ConnectError", "ConnectionError", "NetworkError", "Timeout", "TimeoutException",
                   "TransportError", "ProxyError", "OfflineModeIsEnabled"}


@functools.lru_cache(maxsize=None)
def _unreachable(repo: str) -> str | None:
    """Why the Hub cannot serve `repo` (one quick request, no retries), or None. `datasets` retries an unreachable
    Hub for about half a minute per file; this answers in about a second. Offline mode reads the cache instead."""
    if hub_offline():
        return None
    try:
        from huggingface_hub import HfApi

        HfApi().dataset_info(repo, timeout=10)
    except Exception as err:
        if {cls.__name__ for cls in type(err).__mro__} & _NETWORK_ERRORS:
            return f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else 'no answer'}"
    return None   # reachable, or an answer (gated, missing) that load_dataset reports itself


def _load_hub(corpus: str, config: str, split: str) -> list[dict]:
    try:
        cause = _unreachable(HUB_IDS[corpus])
        if cause is not None:
            raise ConnectionError(cause)
        import datasets

        return [dict(row) for row in datasets.load_dataset(HUB_IDS[corpus], config, split=split)]
    except Exception as err:  # the Hub raises many types (connection, offline mode, missing config)
        cause = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise DataSourceError(
            f"could not load MUSE {corpus} ({config}/{split}) from the Hugging Face Hub dataset {HUB_IDS[corpus]} "
            f"({cause}); for a local copy in the Hub's layout set {ENV_MUSE_DIR} or pass data_dir=... "
            f"(lm-eval: --metadata '{{\"data_dir\": \"...\"}}'; a runner config: data_dir:)") from err


def _checked(rows, corpus: str, config: str, split: str, where: str) -> list[dict]:
    if not isinstance(rows, list) or not rows:
        raise DataSourceError(f"MUSE {corpus} {config}/{split} in {where} holds no rows")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataSourceError(f"MUSE {corpus} {config}/{split} in {where}: row {i} is not an object")
        missing = [f for f in FIELDS[config] if not isinstance(row.get(f), str)]
        if missing:
            raise DataSourceError(f"MUSE {corpus} {config}/{split} in {where}: row {i} has no text field "
                                  f"{', '.join(missing)}")
    return [{f: row[f] for f in FIELDS[config]} for row in rows]


def load_texts(corpus: str, config: str, split: str, data_dir=None) -> list[str]:
    """The `text` of each row of a text config (raw, privleak, scal, sust)."""
    return [row["text"] for row in load_split(corpus, config, split, data_dir)]
