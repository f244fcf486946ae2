"""The code's identity and content fingerprints: what a run record says about the code that computed a cell
(`code_version`, `git_state`) and the content hash of a local directory (a model, a data folder) or file. Foundation
layer: stdlib only, so the testbed, the `cru` lm-eval model, the results store and reporting can read it
(`runner.provenance` builds the cells' inputs on it)."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.resources
import io
import os
import subprocess
import tokenize
from pathlib import Path
from typing import Any, Mapping

CODE_SUFFIXES = (".py", ".yaml", ".yml", ".jinja", ".json", ".txt")
# lm-eval task templates are named `_default_template_yaml` (no suffix, so lm-eval does not index them as tasks);
# they set generation kwargs and metrics, so they are code too.
CODE_NAME_ENDINGS = ("_yaml",)


def is_code_file(name: str) -> bool:
    """Whether a file of the package or its tasks is part of the code version (and of the dirty check)."""
    return Path(name).suffix in CODE_SUFFIXES or name.endswith(CODE_NAME_ENDINGS)


# Files in a model directory that are not the model: build logs with timings.
_NOT_MODEL_FILES = ("testbed_recipe.json", "finetune_record.json")


def _package_dir() -> Path:
    import cru_harness

    return Path(cru_harness.__file__).resolve().parent


def _configs_dir() -> Path | None:
    try:
        return Path(str(importlib.resources.files("cru_harness.configs"))).resolve()
    except ModuleNotFoundError:
        return None


def code_files() -> dict[str, Path]:
    """The package's source files, by their name inside the installed package (`cru_harness/...`), its benchmarks'
    lm-eval task folders (`cru_harness/benchmarks/<name>/tasks`) included. `cru_harness.configs` is left out."""
    files: dict[str, Path] = {}
    configs, root = _configs_dir(), _package_dir()
    for path in sorted(root.rglob("*")):
        if not path.is_file() or not is_code_file(path.name) or "__pycache__" in path.parts:
            continue
        if configs is not None and configs in path.resolve().parents:
            continue
        files[f"cru_harness/{path.relative_to(root).as_posix()}"] = path
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


@contextlib.contextmanager
def quiet_lm_eval_git():
    """lm-eval records `git describe --always` of the working directory with each evaluation, its stderr left on
    the terminal: outside a checkout every cell printed `fatal: not a git repository`. The same lookup, quiet (the
    same value; outside a checkout lm-eval's own fallback)."""
    try:
        from lm_eval import evaluator
        from lm_eval.loggers.utils import get_commit_from_path
    except ImportError:
        yield
        return
    original = evaluator.get_git_commit_hash

    def quiet():
        described = _git(["describe", "--always"], Path(os.getcwd()))
        return described.strip() if described is not None else get_commit_from_path(os.getcwd())

    evaluator.get_git_commit_hash = quiet
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = original


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
    paths = [p for p in (package, _configs_dir()) if p is not None and top_path in (p, *p.parents)]
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


def file_fingerprint(path: str | os.PathLike) -> str:
    """`sha:<content hash>` of one local file (a per-item oracle file, a method's input file)."""
    return f"sha:{hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]}"


def setting_paths(settings: Mapping[str, Any]) -> dict[str, Path]:
    """The settings that name a local file by path (`*_path`, e.g. LUNAR's refusal prompts), key -> path, sorted."""
    return {key: Path(value).expanduser() for key, value in sorted(settings.items())
            if key.endswith("_path") and isinstance(value, str)}
