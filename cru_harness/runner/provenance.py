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
- `libraries`: the versions of the libraries that compute the numbers.

A finished cell whose saved inputs differ from the current ones was computed by other code (or models, data,
libraries): the run recomputes it (`runner.loop.run_cells`) and `report` lists it as stale. Resuming one's
own interrupted run keeps every finished cell: same code, same inputs.

Beside the code version the record keeps the git commit and whether the package's files had uncommitted
changes (`git_state`): such cells are marked dirty in reports, and must never be committed as results.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.resources
import io
import os
import subprocess
import tokenize
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

CODE_SUFFIXES = (".py", ".yaml", ".yml", ".jinja", ".json", ".txt")
# lm-eval task templates are named `_default_template_yaml` (no suffix, so lm-eval does not index them as tasks);
# they set generation kwargs and metrics, so they are code too.
CODE_NAME_ENDINGS = ("_yaml",)


def is_code_file(name: str) -> bool:
    """Whether a file of the package or its tasks is part of the code version (and of the dirty check)."""
    return Path(name).suffix in CODE_SUFFIXES or name.endswith(CODE_NAME_ENDINGS)


# Files in a model directory that are not the model: build logs with timings.
_NOT_MODEL_FILES = ("testbed_recipe.json", "finetune_record.json")
# The libraries whose versions decide the numbers (the project's own version is its code_version).
KEY_LIBRARIES = ("python", "torch", "transformers", "lm_eval", "accelerate", "datasets", "numpy", "scipy",
                 "tokenizers", "safetensors", "rouge_score")
INPUT_FIELDS = ("code_version", "models", "data", "libraries")


def _package_dir() -> Path:
    import cru_harness

    return Path(cru_harness.__file__).resolve().parent


def _tasks_dir() -> Path:
    return Path(str(importlib.resources.files("cru_harness.tasks"))).resolve()


def _configs_dir() -> Path | None:
    try:
        return Path(str(importlib.resources.files("cru_harness.configs"))).resolve()
    except ModuleNotFoundError:
        return None


def code_files() -> dict[str, Path]:
    """The package's source files, by their name inside the installed package (`cru_harness/...`).

    In a git checkout `tasks/` sits beside the package and is installed as `cru_harness.tasks`; in a wheel it is
    inside the package. Both give the same names, hence the same code version. `cru_harness.configs` is left out.
    """
    files: dict[str, Path] = {}
    configs, tasks = _configs_dir(), _tasks_dir()
    for prefix, root in (("cru_harness", _package_dir()), ("cru_harness/tasks", tasks)):
        for path in sorted(root.rglob("*")):
            if not path.is_file() or not is_code_file(path.name) or "__pycache__" in path.parts:
                continue
            parents = path.resolve().parents
            if configs is not None and configs in parents:
                continue
            # in a wheel the tasks sit inside the package: hashed after it, in the same order as from a checkout
            if root != tasks and tasks in parents:
                continue
            files[f"{prefix}/{path.relative_to(root).as_posix()}"] = path
    return files


def _python_tokens(source: bytes) -> bytes:
    """A Python file without its comments and blank lines: a comment edit is not a code change."""
    try:
        tokens = [(tok.type, tok.string) for tok in tokenize.tokenize(io.BytesIO(source).readline)
                  if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING)]
    except (tokenize.TokenError, SyntaxError):
        return source
    return repr(tokens).encode()


def file_digest(name: str, path: Path) -> str:
    data = path.read_bytes()
    if name.endswith(".py"):
        data = _python_tokens(data)
    return hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """Content hash of the package's own source (see module doc); computed once per process."""
    digest = hashlib.sha256()
    for name, path in code_files().items():
        digest.update(f"{name}\0{file_digest(name, path)}\n".encode())
    return digest.hexdigest()[:16]


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def git_state() -> dict[str, Any]:
    """`checkout_state` of this package, once per process."""
    return checkout_state(_package_dir())


def checkout_state(package: Path) -> dict[str, Any]:
    """The commit of the checkout holding the package directory `package`, and whether the package's own files
    (source, tasks, configs) differ from it. Changes elsewhere (README, results/) do not make a tree dirty: they
    do not decide numbers. Outside a git checkout that tracks the package (a wheel, also one installed into a
    venv inside some repository): commit and dirty are None."""
    package = Path(package).resolve()
    top = _git(["rev-parse", "--show-toplevel"], package)
    commit = _git(["rev-parse", "HEAD"], package)
    if top is None or commit is None:
        return {"commit": None, "dirty": None, "dirty_files": []}
    top_path = Path(top.strip()).resolve()
    # an installed package inside some other repository (a venv in a project): that repository's commit is not
    # this code's, so only a checkout that tracks the package's own files names a commit
    if _git(["ls-files", "--error-unmatch", os.path.relpath(package / "__init__.py", top_path)], top_path) is None:
        return {"commit": None, "dirty": None, "dirty_files": []}
    paths = [p for p in (package, _tasks_dir(), _configs_dir()) if p is not None and top_path in (p, *p.parents)]
    status = _git(["status", "--porcelain", "--untracked-files=all", "--",
                   *[os.path.relpath(p, top_path) for p in paths]], top_path)
    changed = [line[3:] for line in (status or "").splitlines()
               if is_code_file(line[3:])]
    return {"commit": commit.strip(), "dirty": bool(changed) if status is not None else None,
            "dirty_files": changed[:20]}


def code_record() -> dict[str, Any]:
    """`code_version` plus the git state beside it (for run records and reproduction reports)."""
    return {"code_version": code_version(), "git": git_state()}


@functools.lru_cache(maxsize=64)
def _directory_fingerprint(path: str, stamp: tuple) -> str:
    digest = hashlib.sha256()
    root = Path(path)
    for file in sorted(root.rglob("*")):
        if not file.is_file() or file.name in _NOT_MODEL_FILES or any(p.startswith(".") for p in
                                                                          file.relative_to(root).parts):
            continue
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def directory_stamp(path: str | os.PathLike) -> tuple[tuple[str, int, int], ...]:
    """(relative path, size, mtime in ns) of every file under a directory: what changes when a file is written,
    read without reading any file."""
    root = Path(path)
    stamp = []
    for f in sorted(root.rglob("*")):
        if f.is_file():
            st = f.stat()   # size and mtime from one stat
            stamp.append((f.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns))
    return tuple(stamp)


def directory_fingerprint(path: str | os.PathLike) -> str:
    """Content hash of the files of a directory (hidden files and build logs left out), cached per process
    while the files' sizes and mtimes stay the same (`directory_stamp`)."""
    root = Path(path).resolve()
    return _directory_fingerprint(str(root), directory_stamp(root))


def model_fingerprint(path: str) -> str:
    """`sha:<content hash>` of the directory a model path resolves to, or `hub:<id>` for a Hub id (not
    downloaded for this)."""
    from .models import resolve_model_path

    resolved = Path(resolve_model_path(path)).expanduser()
    if resolved.is_dir():
        return f"sha:{directory_fingerprint(resolved)}"
    if resolved.is_file():  # a per-item file (retain oracle given as truth ratios)
        return f"sha:{hashlib.sha256(resolved.read_bytes()).hexdigest()[:16]}"
    return f"hub:{path}"


#: `data_fingerprint` of a cell whose benchmark data came from the Hub (local data: `sha:<content hash>`).
HUB_DATA = "hub"


def data_fingerprint(benchmark: str, data_dir: str | None) -> str:
    """`sha:<content hash>` of the local benchmark folder the cell reads (the testbed world included), or
    `hub` when the data comes from the Hub."""
    from ..data.sources import resolve_local_dir
    from .models import resolve_data_dir

    folder = resolve_local_dir(benchmark, resolve_data_dir(data_dir))
    return f"sha:{directory_fingerprint(folder)}" if folder is not None else HUB_DATA


def key_libraries() -> dict[str, str | None]:
    from .cache import library_versions

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


def cell_inputs(cell) -> dict[str, Any]:
    """Everything besides the resolved config that decides a cell's numbers (see module doc)."""
    models = {role: model_fingerprint(path) for role, path in cell_models(cell).items()}
    return {"code_version": code_version(), "models": models, "data": data_fingerprint(cell.benchmark, cell.data_dir),
            "libraries": key_libraries()}


def hub_repositories(benchmark: str, inputs: dict) -> list[tuple[str, str, str]]:
    """(repo type, repo id, a file every copy of it holds) for each Hub repository `inputs` name: the benchmark's
    datasets when its data came from the Hub, and each model given as a Hub id."""
    from ..data.sources import HUB_IDS
    from ..data.tofu import IDK_HUB
    from .plan import is_hub_id

    repos = []
    if inputs.get("data") == HUB_DATA and benchmark in HUB_IDS:
        repos.append(("dataset", HUB_IDS[benchmark], "README.md"))
        if benchmark == "tofu":
            repos.append(("dataset", IDK_HUB[0], IDK_HUB[1]))
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


def recorded_hub_revisions(record: dict | None) -> dict[str, str]:
    """A run record's `hub_revisions`, its well-formed entries only (a damaged record must not break a report)."""
    saved = (record or {}).get("hub_revisions")
    if not isinstance(saved, dict):
        return {}
    return {repo: revision for repo, revision in saved.items() if isinstance(repo, str) and isinstance(revision, str)}


def stale_fields(record: dict | None, current: dict) -> list[str]:
    """The input fields (`code_version`, `models`, ...) in which a cell's saved record differs from `current`;
    every field of `current` counts as differing when the record has no inputs (computed before they existed)."""
    saved = (record or {}).get("inputs") or {}
    return [name for name in INPUT_FIELDS if name in current and saved.get(name) != current[name]]


def record_code(record: dict | None) -> tuple[str, str]:
    """The code version and (12-character) git commit a cell's run record names, or placeholders saying so."""
    record = record or {}
    version = (record.get("inputs") or {}).get("code_version") or record.get("code_version") or "not recorded"
    return version, ((record.get("git") or {}).get("commit") or "unknown")[:12]


def code_commits(records) -> dict[str, set[str]]:
    """Code version -> the commits that computed these run records (`record_code`; a dirty tree's commit is
    marked "+ local changes"): what a report or a study table says about the code behind its cells."""
    versions: dict[str, set[str]] = {}
    for record in records:
        version, commit = record_code(record)
        dirty = ((record or {}).get("git") or {}).get("dirty")
        versions.setdefault(version, set()).add(f"{commit}{' + local changes' if dirty else ''}")
    return versions


def provenance_lines(dirs) -> list[str]:
    """Markdown lines for a report: which code computed the cells under `dirs`, which of them are stale (another
    code version than this checkout's, or none recorded) and which come from a dirty tree."""
    from .cache import CellStore

    current = code_version()
    stale, dirty, records, invalid = [], [], [], {}
    for directory in dirs:
        directory = Path(directory)
        # silent: the report's reading of the same cells (load_results) has already warned about bad files
        store = CellStore(directory.parent if directory.name == "cells" else directory, log=lambda _message: None)
        for cell_hash, result in store.iter_results():
            record = store.load_record(cell_hash) or {}
            records.append(record)
            label = f"{result.get('model')} {result.get('unit')} {result.get('label')} ({cell_hash})"
            if record_code(record)[0] != current:
                stale.append(label)
            if (record.get("git") or {}).get("dirty"):
                dirty.append(label)
        invalid.update(store.invalid)
    if not records and not invalid:
        return []
    total = len(records)
    lines = ["## Provenance", "", f"This checkout's code version: {current}."]
    if invalid:   # a cell the tables silently lacked would change them without a word
        named = "; ".join(f"{path} ({problem})" for path, problem in sorted(invalid.items()))
        lines.append(f"- **{len(invalid)} cell file(s) are not valid**: a cell whose result.json is among them is left "
                     f"out of every table, and `cru-harness run` recomputes it: {named}")
    for version, commits in sorted(code_commits(records).items()):
        lines.append(f"- code version {version}: commit {', '.join(sorted(commits))}")
    if stale:
        lines.append(f"- **{len(stale)} of {total} cells are stale**: computed by other code than this checkout "
                     "(`cru-harness run` recomputes them): " + "; ".join(stale))
    if dirty:
        lines.append(f"- **{len(dirty)} cells come from a dirty tree** (uncommitted changes to the package): not "
                     "reproducible from any commit; do not commit them: " + "; ".join(dirty))
    hub: dict[str, Counter] = defaultdict(Counter)
    for record in records:
        for repo, revision in recorded_hub_revisions(record).items():
            hub[repo][revision] += 1
    for repo, revisions in sorted(hub.items()):
        read = ", ".join(f"{revision[:12] if len(revision) == 40 else revision} ({count} cell{'s' * (count != 1)})"
                         for revision, count in sorted(revisions.items()))
        lines.append(f"- Hub {repo}: {read}" + (" — **more than one revision**" if len(revisions) > 1 else ""))
    return lines + [""]
