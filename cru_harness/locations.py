"""Checks on where a command will write, made before any work starts (training can take hours; finding out
afterwards that `--out` is a file, or not writable, loses all of it), and on model paths given by the user.

- `check_output_dir(path, overwrite=..., allow_existing=...)`: used by `cru-harness unlearn` (the bundle
  directory), `cru-harness finetune` (the checkpoint directory) and `cru-harness run` (the run directory).
- `check_model_path(path)`: a base model given as a local path must exist and hold a `config.json`; a Hub id
  is left to the Hub.
- `write_directory(path, write)`: a directory written whole or not at all; `save_checkpoint` writes a trained
  model, its tokenizer and its record that way (fine-tuning, baselines).

The one output rule every command that writes follows (unlearn, finetune, attack, report --out, score
--output-dir, compare --out; run and merge through `store.check_run_directory`): the file system's root, the home
directory and an existing non-empty directory cru-harness did not write are refused before any work; a directory
is staged in a unique private temporary directory beside the target (never a fixed name that may be the user's);
nothing the harness did not write is deleted; and one process at a time writes a target (`output_lock`).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from .errors import UserError

#: The file that makes a directory a CRU router bundle (`cru.bundle.MANIFEST_NAME` is this name).
BUNDLE_MANIFEST = "cru_bundle.json"
#: The file that makes a directory a WHP model (`baselines.whp`): two models whose logits are combined at inference.
WHP_MANIFEST = "whp.json"
#: The files that show a directory was written by cru-harness (bundle, WHP model, the records of finetune, unlearn
#: and attack, the marker of a directory of reports or scores): only such a directory is written over.
OUTPUT_MARKER = ".cru-harness-output"
HARNESS_FILES = (BUNDLE_MANIFEST, WHP_MANIFEST, "finetune_record.json", "unlearn_record.json",
                 "attack_record.json", OUTPUT_MARKER)
#: What a staging directory's name ends with (`.NAME.RANDOM.staging`, beside its target).
STAGING_SUFFIX = ".staging"


class OutputLocationError(UserError, ValueError):
    """An output location that cannot be written, or that would overwrite existing work without --overwrite."""


class ModelPathError(UserError, ValueError):
    """A local model path that does not exist or is not a Hugging Face model directory."""


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path.cwd()


#: The longest file name (bytes) most file systems take (ext4, XFS, APFS, NTFS: 255).
NAME_MAX = 255
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
    a command writes its own files there by name, and `--overwrite` would remove what is there. Also an empty path
    (it would be the working directory) and a name longer than the file system takes (found before any work,
    not when the result is saved)."""
    from .errors import excerpt

    if not str(path).strip():
        raise OutputLocationError(f"{what} is empty: give a directory")
    for part in Path(path).expanduser().parts:
        if len(part.encode("utf-8", "surrogateescape")) > NAME_MAX:
            raise OutputLocationError(f"{what} {excerpt(str(path), 120)}: the name {excerpt(part, 60)} is "
                                      f"{len(part.encode('utf-8', 'surrogateescape')):,} bytes, more than a file "
                                      f"system takes ({NAME_MAX})")
    resolved = Path(path).expanduser().resolve()
    home = Path.home().resolve()
    if resolved == Path(resolved.anchor) or resolved == home or resolved in home.parents:
        kind = "the home directory" if resolved == home else "the file system root" if resolved == Path(
            resolved.anchor) else "a parent of the home directory"
        raise OutputLocationError(f"{what} {path} is {kind}: give a directory of its own (e.g. {what} "
                                  f"{Path(path) / 'cru-run'})")


def _held_entries(path: Path) -> list[str]:
    return sorted(entry.name + ("/" if entry.is_dir() else "") for entry in path.iterdir()
                  if not entry.name.startswith(WRITE_TEST_PREFIX))


def written_by_harness(path: str | os.PathLike) -> bool:
    """Whether directory `path` holds one of `HARNESS_FILES`: a bundle, a checkpoint or records cru-harness wrote."""
    return any((Path(path) / name).is_file() and not (Path(path) / name).is_symlink() for name in HARNESS_FILES)


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _directory_target(path: str | os.PathLike, what: str) -> Path:
    """`path` as a directory a command may write into, expanded: never the root, home or working directory (given
    as it is or expanded), a symbolic link, or a file."""
    check_not_shared_directory(path, what)   # the path as given: an empty one is not the working directory
    path = Path(path).expanduser()
    check_not_shared_directory(path, what)
    if path.is_symlink():
        raise OutputLocationError(f"{what} {path} is a symbolic link: give the directory itself")
    if path.exists() and not path.is_dir():
        raise OutputLocationError(f"{what} {path} exists and is not a directory")
    return path


def check_output_dir(path: str | os.PathLike, *, what: str = "output directory", overwrite: bool = False,
                     allow_existing: bool = False, overwrite_hint: str = "--overwrite", staged: bool = False) -> Path:
    """Raise `OutputLocationError` unless `path` can be written as a directory; creates nothing.

    A directory that exists and is not empty (write probes aside) holds earlier work: refused unless `overwrite`
    (its files are then replaced) or `allow_existing` (the runner resumes in its own directory); the message
    names `overwrite_hint`. `overwrite` replaces only what cru-harness wrote (`written_by_harness`): a directory of
    other files is refused whatever the flags. The nearest existing parent of a new directory must be a writable
    directory. (`staged` is accepted for older callers: staging now uses a fresh unique directory.)
    """
    path = _directory_target(path, what)
    if path.is_dir():
        held_files = _held_entries(path)
        if held_files and not (overwrite or allow_existing):
            held = "a router bundle" if (path / BUNDLE_MANIFEST).is_file() else (
                "a model checkpoint" if (path / "config.json").is_file() else "files")
            raise OutputLocationError(f"{what} {path} already exists and holds {held}; pass {overwrite_hint} to "
                                      "replace it, or choose another path")
        if held_files and overwrite and not allow_existing and not written_by_harness(path):
            raise OutputLocationError(f"{what} {path} holds files cru-harness did not write ({_shown(held_files)}): "
                                      f"{overwrite_hint} replaces only a bundle, model or record it wrote; choose "
                                      "a new or empty directory")
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


def check_remote_code(path: str | os.PathLike, trust_remote_code: bool, what: str = "model") -> None:
    """A local checkpoint whose architecture transformers does not know and whose config.json maps it to its own
    Python code (`auto_map`) cannot load without running that code: refused in one line, before anything loads,
    unless `trust_remote_code` (the code is never run unasked)."""
    if trust_remote_code:
        return
    config_file = Path(str(path)).expanduser() / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return   # absent or unreadable: the loader names that
    if not isinstance(config, dict) or not config.get("auto_map"):
        return
    from transformers import CONFIG_MAPPING

    if config.get("model_type") in CONFIG_MAPPING:
        return   # transformers has the architecture itself: nothing of the checkpoint's code runs
    from .errors import excerpt

    raise ModelPathError(f"{what} {path} needs its own Python code to load (config.json maps model_type "
                         f"{excerpt(config.get('model_type'), 60)} to it through auto_map) and trust_remote_code is "
                         "off: cru-harness does not run a checkpoint's code unasked; set trust_remote_code: true for "
                         "this model only if you trust its code")


def check_single_checkpoint(path: str | os.PathLike, what: str = "model") -> None:
    """Refuse a WHP directory where one checkpoint is loaded: it holds two models, and only their combined logits
    are the unlearned model (lm-eval's `cru` model loads the pair)."""
    if (Path(str(path)).expanduser() / WHP_MANIFEST).is_file():
        raise ModelPathError(f"{what} {path} is a WHP model (two models whose logits are combined at inference, "
                             f"{WHP_MANIFEST}): lm-eval's cru model scores it (base={path}); it cannot be loaded, "
                             "quantized or trained as one checkpoint")


def staging_dir(path: str | os.PathLike) -> Path:
    """A new, unique, private (0700) directory beside `path` that `write_directory` fills before it replaces
    `path`: never a fixed name, which could be the user's own directory (or another process's staging)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name[:100]}.", suffix=STAGING_SUFFIX, dir=path.parent))


def _umask_mode() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o777 & ~mask


def write_directory(path: str | os.PathLike, write: Callable[[Path], None], *, overwrite: bool | None = None,
                    what: str = "output directory") -> Path:
    """`write(tmp)` fills a fresh staging directory beside `path` (`staging_dir`), which then replaces `path`: a
    run killed while saving leaves the previous directory (or none), never a half-written checkpoint that looks
    whole, and an overwrite leaves no stale file (a shard of a larger earlier save) behind.

    Under `output_lock`, `path` is checked again when the result is ready (another process may have written it
    meanwhile): a non-empty `path` is replaced only when `overwrite` allows it (None: when cru-harness wrote it)
    and cru-harness wrote it; otherwise the finished result is kept in its staging directory and named. A failed
    `write` removes only the staging directory."""
    path = Path(path)
    tmp = staging_dir(path)
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    os.chmod(tmp, _umask_mode())   # mkdtemp's 0700 would keep the result from the user's group
    with output_lock(path, what):
        held = path.is_dir() and not path.is_symlink() and _held_entries(path)
        if path.is_symlink() or path.exists() and not path.is_dir() or held and (
                overwrite is False or not written_by_harness(path)):
            why = ("is no longer an empty directory" if path.is_dir() and not path.is_symlink()
                   else "is now a file or a link")
            raise OutputLocationError(f"{what} {path} {why} (written by someone else meanwhile?): it is left as it "
                                      f"is, and the result is kept in {tmp}")
        old = None
        if path.is_dir():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name[:100]}.", suffix=".old", dir=path.parent))
            path.replace(old / path.name)
        try:
            tmp.replace(path)
        except BaseException:
            if old is not None:
                (old / path.name).replace(path)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return path


# ------------------------------------------------------------------------------------------- output lock
_HELD_LOCKS: set[str] = set()


def _has_flock(directory: Path) -> bool:
    """Whether `directory`'s file system implements flock (some network file systems do not), tried on a probe file
    of this process's own, so that no lock file is created or removed by the test."""
    if os.name != "posix":
        return True   # filelock uses Windows' own locking there
    import fcntl

    probe = directory / f".flock-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return True   # a missing or read-only directory: the lock's own acquire reports it, where it did before
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except OSError as error:   # EWOULDBLOCK: another thread's probe holds it, so flock works; the lock reports others
        return error.errno != errno.ENOSYS
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def file_lock(path: Path, **kwargs):
    """A `filelock` lock on `path` (kwargs: FileLock's). Where the file system has no flock, the existence lock (a file
    created exclusively, `SoftFileLock`) is taken directly: filelock's own fallback (4.0.8) first deletes the file it
    opened, which may be another process's held lock."""
    from filelock import FileLock, SoftFileLock

    if not _has_flock(Path(path).parent):
        return SoftFileLock(str(path), **kwargs)
    return FileLock(str(path), fallback_to_soft=False, **kwargs)


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file of output `path`: `.NAME.lock` beside it, or in its nearest existing ancestor (nothing is
    created for a lock); removed when released."""
    path = Path(path).expanduser().absolute()
    directory = next((d for d in path.parents if d.is_dir()), Path.cwd())
    return directory / f".{path.name[:200]}.lock"


@contextmanager
def output_lock(path: str | os.PathLike, what: str = "output directory") -> Iterator[None]:
    """One process at a time writes `path` (`filelock`): a second is refused at once, naming the process that
    holds it (pid, host, start). A lock left by a killed process is free (flock dies with its holder). Re-entrant
    within a process (a command holding it may save through `write_directory`)."""
    from filelock import Timeout

    from .errors import excerpt

    lock_file = lock_path(path)
    key = str(lock_file)
    if key in _HELD_LOCKS:
        yield
        return
    lock = file_lock(lock_file, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise OutputLocationError(f"{what} {excerpt(str(path))} is being written by {describe_holder(lock_file)} "
                                  f"(lock {lock_file.name}); wait for it to finish, or choose another path") from None
    except OSError as err:   # a read-only or full place: the machine's, one line
        from .errors import OutputWriteError

        failure = OutputWriteError(f"{what} {excerpt(str(path))} cannot be written: {err.strerror or err}")
        failure.errno = err.errno
        raise failure from None
    _HELD_LOCKS.add(key)
    try:
        write_holder(lock_file)
        yield
    finally:
        _HELD_LOCKS.discard(key)
        try:
            lock_file.unlink(missing_ok=True)   # while still held: no litter beside the user's output
        finally:
            lock.release()


@contextmanager
def command_output_lock(path: str | os.PathLike | None, what: str = "--out") -> Iterator[None]:
    """`output_lock` held by a command for its whole work (checks, training, save), so that a second command on
    the same output is refused at once instead of training for hours and then replacing the first's result. Under
    `accelerate launch` only the main process (RANK 0) locks: it alone saves."""
    if path is None or os.environ.get("RANK", "0") not in ("", "0"):
        yield
        return
    target = Path(path).expanduser()
    existed = target.exists() or target.is_symlink()
    with output_lock(path, what):
        try:
            yield
        except BaseException:
            # refused input, or a failure before anything was saved: no empty --out is left behind (only an empty
            # directory this command created is removed; nothing else ever is)
            if not existed and target.is_dir() and not target.is_symlink() and not any(target.iterdir()):
                target.rmdir()
            raise


def holder_record(**extra) -> dict:
    from datetime import datetime, timezone

    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), **extra}


def write_holder(lock_file: Path, record: dict | None = None) -> None:
    """Who holds `lock_file`, written into it in place (the lock belongs to its inode)."""
    try:
        with open(lock_file, "r+", encoding="utf-8") as handle:
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(record or holder_record()) + "\n")
            handle.flush()
    except OSError:
        pass   # the record is for messages only


def read_holder(lock_file: Path) -> dict | None:
    try:
        data = json.loads(Path(lock_file).read_text(encoding="utf-8") or "null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def describe_holder(lock_file: Path | dict | None) -> str:
    info = lock_file if isinstance(lock_file, dict) or lock_file is None else read_holder(lock_file)
    if not info:
        return "another process (no details recorded)"
    what = f"process {info.get('pid')} on host {info.get('host')}"
    if info.get("started"):
        what += f", started {info['started']}"
    if info.get("shard"):
        what += f", shard {info['shard']}"
    return what


# ------------------------------------------------------------------------------ directories of named files
def check_files_dir(path: str | os.PathLike, *, what: str, own: bool = False) -> Path:
    """Where a command writes files by name (report, score, compare): refused, before any work, when it is the
    root or home directory, a file or a link, or an existing non-empty directory cru-harness did not write
    (`OUTPUT_MARKER`); `own`: the directory belongs to a run (its report/, the run itself), taken as it is."""
    path = _directory_target(path, what)
    if path.is_dir() and not own:
        held = _held_entries(path)
        if held and not written_by_harness(path):
            raise OutputLocationError(f"{what} {path} is not empty and was not written by cru-harness (it holds "
                                      f"{_shown(held)}): its files could be overwritten; choose a new or empty "
                                      "directory")
    return check_output_dir(path, what=what, allow_existing=True)


def make_files_dir(path: str | os.PathLike, *, own: bool = False) -> Path:
    """Create `path` (checked by `check_files_dir`) when the command is about to write; a directory it creates
    (or finds empty) is marked as cru-harness's (`OUTPUT_MARKER`), so a later run may write over its files."""
    path = Path(path).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    if not own and not written_by_harness(path):
        (path / OUTPUT_MARKER).write_text("written by cru-harness; a later command may replace its files\n")
    return path


def save_checkpoint(path: str | os.PathLike, model, tokenizer, record_name: str, record: dict,
                    save_function: Callable, overwrite: bool | None = None) -> Path:
    """A trained model (saved with accelerate's `save_function`), its tokenizer and its JSON record
    (`record_name`), written whole (`write_directory`)."""
    import json

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, save_function=save_function)
        tokenizer.save_pretrained(tmp)
        (tmp / record_name).write_text(json.dumps(record, indent=2, default=str))

    return write_directory(path, write, overwrite=overwrite)
