"""Checks on where a command will write, made before any work starts (training can take hours; finding out
afterwards that `--out` is a file, or not writable, loses all of it), and on model paths given by the user.

- `check_output_dir(path, overwrite=..., allow_existing=...)`: used by `cru-harness unlearn` (the bundle
  directory), `cru-harness finetune` (the checkpoint directory) and `cru-harness run` (the run directory).
- `check_model_path(path)`: a base model given as a local path must exist and hold a `config.json`; a Hub id
  is left to the Hub.
- `write_directory(path, write)`: a directory written whole or not at all; `save_checkpoint` writes a trained
  model, its tokenizer and its record that way (fine-tuning, baselines).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from .errors import UserError

#: The file that makes a directory a CRU router bundle (`cru.bundle.MANIFEST_NAME` is this name).
BUNDLE_MANIFEST = "cru_bundle.json"
#: The file that makes a directory a WHP model (`baselines.whp`): two models whose logits are combined at inference.
WHP_MANIFEST = "whp.json"


class OutputLocationError(UserError, ValueError):
    """An output location that cannot be written, or that would overwrite existing work without --overwrite."""


class ModelPathError(UserError, ValueError):
    """A local model path that does not exist or is not a Hugging Face model directory."""


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path.cwd()


#: The name of `_writable`'s probe file; another process's probe does not make a directory "hold files".
WRITE_TEST_PREFIX = ".cru-harness-write-test-"


def _writable(directory: Path) -> bool:
    """Whether a file can be created in `directory` (tried for real: os.access is wrong for root and ACLs)."""
    try:
        fd, name = tempfile.mkstemp(prefix=WRITE_TEST_PREFIX, dir=directory)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def check_not_shared_directory(path: str | os.PathLike, what: str = "output directory") -> None:
    """Refuse the file system's root and the home directory (or one of its parents) as an output directory:
    a command writes its own files there by name, and `--overwrite` would remove what is there."""
    resolved = Path(path).expanduser().resolve()
    home = Path.home().resolve()
    if resolved == Path(resolved.anchor) or resolved == home or resolved in home.parents:
        kind = "the home directory" if resolved == home else "the file system root" if resolved == Path(
            resolved.anchor) else "a parent of the home directory"
        raise OutputLocationError(f"{what} {path} is {kind}: give a directory of its own (e.g. {what} "
                                  f"{Path(path) / 'cru-run'})")


def check_output_dir(path: str | os.PathLike, *, what: str = "output directory", overwrite: bool = False,
                     allow_existing: bool = False, overwrite_hint: str = "--overwrite", staged: bool = False) -> Path:
    """Raise `OutputLocationError` unless `path` can be written as a directory; creates nothing.

    A directory that exists and is not empty (write probes aside) holds earlier work: refused unless `overwrite`
    (its files are then replaced) or `allow_existing` (the runner resumes in its own directory); the message
    names `overwrite_hint`. The nearest existing parent of a new directory must be a writable directory.
    `staged`: the directory is written whole through `staging_dir` (`save_checkpoint`), so that must not be a file.
    """
    path = Path(path).expanduser()
    check_not_shared_directory(path, what)
    if path.exists() and not path.is_dir():
        raise OutputLocationError(f"{what} {path} exists and is not a directory")
    if staged and (staging := staging_dir(path)).exists() and not staging.is_dir():   # else found after training
        raise OutputLocationError(f"{what} {path} is saved through {staging}, which is a file: move it away")
    if path.is_dir():
        held_files = any(not entry.name.startswith(WRITE_TEST_PREFIX) for entry in path.iterdir())
        if held_files and not (overwrite or allow_existing):
            held = "a router bundle" if (path / BUNDLE_MANIFEST).is_file() else (
                "a model checkpoint" if (path / "config.json").is_file() else "files")
            raise OutputLocationError(f"{what} {path} already exists and holds {held}; pass {overwrite_hint} to "
                                      "replace it, or choose another path")
        if not _writable(path):
            raise OutputLocationError(f"{what} {path} is not writable")
        return path
    parent = _nearest_existing(path.parent)
    if not parent.is_dir():
        raise OutputLocationError(f"{what} {path} cannot be created: {parent} is a file, not a directory")
    if not _writable(parent):
        raise OutputLocationError(f"{what} {path} cannot be created: {parent} is not writable")
    return path


def looks_local(path: str) -> bool:
    """A path rather than a Hub id (`org/name`): absolute, relative with ./ ../ ~, or more than one `/`."""
    return path.startswith(("/", "./", "../", "~", ".")) or path.count("/") > 1 or os.sep != "/" and os.sep in path


def check_model_path(path: str | os.PathLike, what: str = "base model") -> str:
    """A local model directory must exist and hold `config.json`; a Hub id (`org/name`, `name`) passes."""
    text = str(path)
    if not text.strip():
        raise ModelPathError(f"{what} is empty: give a Hugging Face model id or a local directory")
    local = Path(text).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ModelPathError(f"{what} {text} is a file, not a model directory")
        check_single_checkpoint(text, what)
        if not (local / "config.json").is_file():
            raise ModelPathError(f"{what} directory {text} holds no config.json: not a Hugging Face model "
                                 "checkpoint (save one with save_pretrained)")
        return text
    if looks_local(text):
        raise ModelPathError(f"{what} {text} does not exist (no such directory)")
    return text


def check_single_checkpoint(path: str | os.PathLike, what: str = "model") -> None:
    """Refuse a WHP directory where one checkpoint is loaded: it holds two models, and only their combined logits
    are the unlearned model (lm-eval's `cru` model loads the pair)."""
    if (Path(str(path)).expanduser() / WHP_MANIFEST).is_file():
        raise ModelPathError(f"{what} {path} is a WHP model (two models whose logits are combined at inference, "
                             f"{WHP_MANIFEST}): lm-eval's cru model scores it (base={path}); it cannot be loaded, "
                             "quantized or trained as one checkpoint")


def staging_dir(path: str | os.PathLike) -> Path:
    """The sibling `write_directory` fills before it replaces `path` (a leftover of a killed save is replaced)."""
    path = Path(path)
    return path.with_name(path.name + ".tmp")


def write_directory(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """`write(tmp)` fills a sibling temporary directory, which then replaces `path`: a run killed while saving
    leaves the previous directory (or none), never a half-written checkpoint that looks whole, and an
    overwrite leaves no stale file (a shard of a larger earlier save) behind."""
    path = Path(path)
    tmp = staging_dir(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        shutil.rmtree(path)
    tmp.replace(path)
    return path


def save_checkpoint(path: str | os.PathLike, model, tokenizer, record_name: str, record: dict,
                    save_function: Callable) -> Path:
    """A trained model (saved with accelerate's `save_function`), its tokenizer and its JSON record
    (`record_name`), written whole (`write_directory`)."""
    import json

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, save_function=save_function)
        tokenizer.save_pretrained(tmp)
        (tmp / record_name).write_text(json.dumps(record, indent=2, default=str))

    return write_directory(path, write)
