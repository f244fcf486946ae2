"""TOFU (locuslab/TOFU): every config is one JSON-lines file `{config}.json`, split `train`."""
from __future__ import annotations

import os
import re

from ...api import DataSource
from ...errors import InputError
from ...data.sources import DataSourceError, hub_unreachable, hub_unreachable_now, read_json_records, resolve_local_dir

#: TOFU's data (the TOFU plugin's `data` hook): the Hub dataset, or a folder holding `forget10_perturbed.json`.
SOURCE = DataSource(folder="tofu", marker="forget10_perturbed.json", hub_id="locuslab/TOFU",
                    env_var="CRU_HARNESS_TOFU_DIR")

FORGET_SPLITS = ("forget01", "forget05", "forget10")
TOFU_CONFIGS = (
    "full",
    *FORGET_SPLITS,
    "retain90", "retain95", "retain99",
    "holdout01", "holdout05", "holdout10",
    "forget01_perturbed", "forget05_perturbed", "forget10_perturbed",
    "retain_perturbed",
    "real_authors", "real_authors_perturbed",
    "world_facts", "world_facts_perturbed",
)
# Fields each config's rows must carry; checked so a wrong file fails here, not as NaN in a metric.
REQUIRED_FIELDS = {
    "perturbed": ("question", "answer", "paraphrased_answer", "perturbed_answer"),
    "mc_perturbed": ("question", "answer", "perturbed_answer"),
    "mc": ("question", "answer", "option1", "option2", "option3", "option4"),
    "qa": ("question", "answer"),
}


def _required_fields(config: str) -> tuple[str, ...]:
    if config in ("real_authors_perturbed", "world_facts_perturbed"):
        return REQUIRED_FIELDS["mc_perturbed"]
    if config.endswith("_perturbed"):
        return REQUIRED_FIELDS["perturbed"]
    if config in ("real_authors", "world_facts"):
        return REQUIRED_FIELDS["mc"]
    return REQUIRED_FIELDS["qa"]


def retain_config_for(forget_config: str) -> str:
    """TOFU pairs each forget split with the complementary retain split: forget10 -> retain90."""
    split = forget_config.removesuffix("_perturbed")
    if split not in FORGET_SPLITS:
        raise InputError(f"unknown TOFU forget split {forget_config!r}; expected one of {', '.join(FORGET_SPLITS)}")
    return f"retain{100 - int(split.removeprefix('forget')):02d}"


def load_tofu(config: str, data_dir: str | os.PathLike | None = None) -> list[dict]:
    """All rows of one TOFU config, from `data_dir` / the env vars if set, else from the Hub."""
    if config not in TOFU_CONFIGS:
        raise InputError(f"unknown TOFU config {config!r}; valid configs: {', '.join(TOFU_CONFIGS)}")
    local = resolve_local_dir(SOURCE, data_dir)
    if local is not None:
        rows = read_json_records(local / f"{config}.json")
    else:
        rows = _load_from_hub(config)
    fields = _required_fields(config)
    for index, row in enumerate(rows):
        missing = [field for field in fields if field not in row]
        if missing:
            raise DataSourceError(f"TOFU {config} row {index} lacks field(s) {', '.join(missing)}")
    return rows


# LUNAR's single-author split (Shen et al. 2025). LUNAR's own dataset/unlearning/dataset_download.py (first commit
# of facebookresearch/LUNAR) labels row i of TOFU `full` as edge `author_{i // 20 + 1}`: TOFU lists its authors in
# blocks of 20 QA pairs. Forget = one edge; LUNAR trains on every other edge as retain (dataset_utils.py
# split_raw_dataset_for_forget) and evaluates the retain edges' first 200 rows (eval_util.py get_dataloader).
AUTHOR_ROWS = 20
AUTHOR_RETAIN_EVAL_ROWS = 200
AUTHOR_SOURCE = re.compile(r"(not_)?author_(\d+)")


def parse_author_source(name: str) -> tuple[int, bool] | None:
    """`author_K` -> (K, False): author K's rows; `not_author_K` -> (K, True): every other author's rows; else None."""
    match = AUTHOR_SOURCE.fullmatch(str(name))
    return (int(match.group(2)), bool(match.group(1))) if match else None


def load_author_rows(author: int, data_dir: str | os.PathLike | None = None, *, others: bool = False) -> list[dict]:
    """LUNAR's `author_{author}` edge of TOFU `full` (its 20 rows), or with `others` every other author's rows in
    file order. Authors are numbered from 1, as LUNAR numbers them."""
    rows = load_tofu("full", data_dir)
    n_authors = len(rows) // AUTHOR_ROWS
    if len(rows) % AUTHOR_ROWS:
        raise DataSourceError(f"TOFU full has {len(rows)} rows, not blocks of {AUTHOR_ROWS} per author")
    if isinstance(author, bool) or not isinstance(author, int) or not 1 <= author <= n_authors:
        raise InputError(f"TOFU author {author!r}: expected an author number in 1..{n_authors}")
    start, stop = (author - 1) * AUTHOR_ROWS, author * AUTHOR_ROWS
    return rows[:start] + rows[stop:] if others else rows[start:stop]


def _load_from_hub(config: str) -> list[dict]:
    if (offline := hub_unreachable_now(SOURCE, f"TOFU config {config!r}")) is not None:
        raise offline   # at once, not after the Hub client's retries
    try:
        import datasets

        return [dict(row) for row in datasets.load_dataset(SOURCE.hub_id, config, split="train")]
    except Exception as err:  # the Hub raises many types (connection, offline mode, missing config)
        raise hub_unreachable(SOURCE, f"TOFU config {config!r}", err) from err


# TOFU's refusal answers are not in the locuslab/TOFU dataset: TOFU's GitHub repository ships them
# (data/idontknow.jsonl), and open-unlearning's setup_data.py fetches the Hub copy it reads from this dataset.
IDK_HUB = ("open-unlearning/idk", "idk.jsonl")


def load_idontknow(data_dir: str | os.PathLike | None = None) -> list[str]:
    """TOFU's refusal answers (`idontknow.jsonl` in a local copy, one per line; from the Hub, open-unlearning's
    `idk.jsonl`, `IDK_HUB`), used by IdkDPO and the refusal class."""
    local = resolve_local_dir(SOURCE, data_dir)
    if local is not None:
        path = local / "idontknow.jsonl"
        if not path.is_file():
            raise DataSourceError(f"{path} is missing: the local TOFU copy needs TOFU's idontknow.jsonl")
    else:
        if (offline := hub_unreachable_now(SOURCE, f"TOFU's refusal answers ({IDK_HUB[1]})", IDK_HUB[0])) is not None:
            raise offline
        try:
            from huggingface_hub import hf_hub_download

            path = hf_hub_download(IDK_HUB[0], IDK_HUB[1], repo_type="dataset")
        except Exception as err:
            raise hub_unreachable(SOURCE, f"TOFU's refusal answers ({IDK_HUB[1]})", err, repo=IDK_HUB[0]) from err
    with open(path, encoding="utf-8") as handle:
        lines = [line.strip() for line in handle if line.strip()]
    if not lines:
        raise DataSourceError(f"{path} holds no refusal answers")
    return lines
