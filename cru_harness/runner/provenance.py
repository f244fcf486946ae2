"""What decides a cell's numbers besides its resolved config: the code, the models, the data, the libraries.

A cell's directory is named by the hash of its resolved config (`plan.Cell.hash`: *which* cell it is, the same
in every run of the config, so runs can be compared cell by cell). Whether a finished cell may be reused is
decided by its *inputs* (`cell_inputs`), saved in its run record:

- `code_version`: a content hash of the package's own source (`cru_harness/**/*.py` and the lm-eval task
  folder, comments and blank lines ignored; the shipped configs are left out, the resolved config is the cell
  hash). It is the same from a git checkout and from a wheel, and README or results edits do not change it;
- `models`: a content hash of every local model directory the cell reads (testbed builds, SmolLM2, local
  checkpoints); Hub ids are recorded as ids;
- `data`: a content hash of the local benchmark folder (or the testbed world), or "hub" (Hub data and Hub models
  are named, not hashed: the record keeps, beside the inputs, the revision each resolved to, `hub_revisions`,
  which `report` and `--reproduce` show);
- `libraries`: the versions of the libraries that compute the numbers;
- `files`: a content hash of each local file a method setting names (`*_path`, e.g. LUNAR's refusal prompts),
  only for cells whose settings name one: the setting holds a path, so another file at the same path is
  another input, not another cell.

A finished cell whose saved inputs differ from the current ones was computed by other code (or models, data,
libraries): the run recomputes it (`runner.loop.run_cells`) and `report` lists it as stale. Resuming one's
own interrupted run keeps every finished cell: same code, same inputs.

Beside the code version the record keeps the git commit and whether the package's files had uncommitted
changes (`git_state`): such cells are marked dirty in reports, and must never be committed as results.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

# The libraries whose versions decide the numbers (the project's own version is its code_version).
KEY_LIBRARIES = ("python", "torch", "transformers", "lm_eval", "accelerate", "datasets", "numpy", "scipy",
                 "tokenizers", "safetensors", "rouge_score")
INPUT_FIELDS = ("code_version", "models", "data", "libraries", "files")

# The code identity and directory fingerprints are foundation (`cru_harness.fingerprints`); imported here under
# their old names.
from ..reporting.provenance import (code_commits, provenance_lines, record_code,  # noqa: F401,E402
                                    recorded_hub_revisions)
from ..fingerprints import (CODE_NAME_ENDINGS, CODE_SUFFIXES, checkout_state, code_files,  # noqa: E402,F401
                            code_record,
                            code_version, directory_fingerprint, directory_stamp, file_digest, file_fingerprint,
                            git_state, is_code_file, setting_paths)


def model_fingerprint(path: str) -> str:
    """`sha:<content hash>` of the directory a model path resolves to, or `hub:<id>` for a Hub id (not
    downloaded for this)."""
    from .models import resolve_model_path

    resolved = Path(resolve_model_path(path)).expanduser()
    if resolved.is_dir():
        return f"sha:{directory_fingerprint(resolved)}"
    if resolved.is_file():  # a per-item file (retain oracle given as truth ratios)
        return file_fingerprint(resolved)
    return f"hub:{path}"


#: `data_fingerprint` of a cell whose benchmark data came from the Hub (local data: `sha:<content hash>`).
HUB_DATA = "hub"


def data_fingerprint(benchmark: str, data_dir: str | None) -> str:
    """`sha:<content hash>` of the local benchmark folder the cell reads (the testbed world included), or
    `hub` when the data comes from the Hub."""
    from .. import plugins
    from ..data.sources import resolve_local_dir
    from .models import resolve_data_dir

    plugin = plugins.benchmarks.get(benchmark)   # its `data` hook: tofu_author reads TOFU's folder
    if plugin.data is None:   # no data folder of its own (its tasks read lm-eval's data): nothing local to hash
        return HUB_DATA
    folder = resolve_local_dir(plugin, resolve_data_dir(data_dir))
    return f"sha:{directory_fingerprint(folder)}" if folder is not None else HUB_DATA


def key_libraries() -> dict[str, str | None]:
    from ..store import library_versions

    versions = library_versions()
    return {name: versions.get(name) for name in KEY_LIBRARIES}


def cell_models(cell) -> dict[str, str]:
    """The model paths a cell reads, by role."""
    models = {"model": cell.model.path}
    retain = cell.extra.get("retain") or {}
    if retain.get("kind") == "checkpoint":
        models["retain"] = retain["value"]
    elif retain.get("kind") == "per_item":
        models["retain_per_item"] = retain["value"]
    elif retain.get("kind") == "train" and (retain.get("value") or {}).get("from"):
        models["retain_from"] = retain["value"]["from"]
    if cell.extra.get("purge_local_checkpoint"):
        models["purge"] = cell.extra["purge_local_checkpoint"]
    return models


def input_files(hparams: dict[str, Any]) -> dict[str, str]:
    """`sha:<content hash>` of each local file a method setting (`*_path`) names; a missing one is left to the
    method's own error."""
    return {key: file_fingerprint(path) for key, path in setting_paths(hparams).items() if path.is_file()}


def cell_inputs(cell) -> dict[str, Any]:
    """Everything besides the resolved config that decides a cell's numbers (see module doc)."""
    models = {role: model_fingerprint(path) for role, path in cell_models(cell).items()}
    inputs = {"code_version": code_version(), "models": models,
              "data": data_fingerprint(cell.benchmark, cell.data_dir), "libraries": key_libraries()}
    # only where a setting names a file, so that the cells of every other method keep the inputs they had
    files = input_files(cell.hparams)
    if files:
        inputs["files"] = files
    return inputs


def hub_repositories(benchmark: str, inputs: dict) -> list[tuple[str, str, str]]:
    """(repo type, repo id, a file every copy of it holds) for each Hub repository `inputs` name: the benchmark's
    datasets when its data came from the Hub, and each model given as a Hub id."""
    from .. import plugins
    from .plan import is_hub_id

    repos = []
    if inputs.get("data") == HUB_DATA and benchmark in plugins.benchmarks:
        repos.extend(("dataset", repo, file) for repo, file in plugins.benchmarks.get(benchmark).hub_files)
    for fingerprint in dict.fromkeys((inputs.get("models") or {}).values()):
        # `model_fingerprint` names any path that is not on disk "hub:"; only a Hub-shaped one is looked up
        if isinstance(fingerprint, str) and fingerprint.startswith("hub:"):
            repo = fingerprint.removeprefix("hub:")
            if is_hub_id(repo):
                repos.append(("model", repo, "config.json"))
    return repos


def hub_revisions(benchmark: str, inputs: dict) -> dict[str, str]:
    """`"<type>:<repo>"` -> the commit the local Hub cache resolves `main` to, for each Hub repository of
    `hub_repositories`; read after the cell ran, so it is the revision the cell read (loads name no revision, so
    they resolve `main`, online or offline). Kept in the run record beside `inputs` but not among them: an
    offline rerun could not tell another revision from none, and a cache emptied since would recompute."""
    from huggingface_hub import try_to_load_from_cache

    revisions = {}
    for repo_type, repo, filename in hub_repositories(benchmark, inputs):
        try:
            path = try_to_load_from_cache(repo, filename, repo_type=repo_type)
        except ValueError:  # not a valid Hub id (a local path that is missing): the cell's own error says so
            continue
        except OSError as err:  # an unreadable cache must not cost the finished cell its result
            revisions[f"{repo_type}:{repo}"] = f"unreadable Hub cache ({err})"
            continue
        revisions[f"{repo_type}:{repo}"] = Path(path).parent.name if isinstance(path, str) else "not in the Hub cache"
    return revisions


def stale_fields(record: dict | None, current: dict) -> list[str]:
    """The input fields (`code_version`, `models`, ...) in which a cell's saved record differs from `current`;
    every field of `current` counts as differing when the record has no inputs (computed before they existed)."""
    saved = (record or {}).get("inputs") or {}
    return [name for name in INPUT_FIELDS if name in current and saved.get(name) != current[name]]
