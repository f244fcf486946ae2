"""`--use_cache DB` and the `cru` model: lm-eval keys its cache by the requests alone, so a cache another base,
bundle set or dtype wrote would hand back that model's numbers as this one's. The cache holds the identity of the
model that wrote it, and any other model is refused."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .arguments import ModelArgumentError

#: The `--use_cache` database entry naming the model that wrote it (lm-eval's own keys are SHA-256 hex digests).
CACHE_IDENTITY_KEY = "cru_harness:model_identity"


def base_identity(pretrained, revision) -> dict[str, Any]:
    """A local directory by its resolved path and its files' names, sizes and mtimes; a Hub id by id and revision."""
    if not isinstance(pretrained, (str, Path)):
        raise ModelArgumentError("--use_cache needs a base given by path or Hub id (a model object passed in "
                                 "cannot be told from another)")
    path = Path(pretrained).expanduser()
    if path.is_dir():
        from cru_harness.fingerprints import directory_stamp

        return {"path": str(path.resolve()), "files": directory_stamp(path)}
    return {"hub": str(pretrained), "revision": revision}


def check_cache(db, mine: dict[str, Any]) -> None:
    """Refuse a cache database another model wrote (or one that names no model); record `mine` in a new one."""
    theirs = db.get(CACHE_IDENTITY_KEY)
    where = f"--use_cache {getattr(db, 'filename', '')}".rstrip()
    if theirs is None and len(db):
        raise ModelArgumentError(f"{where}: holds results of a model it does not name (written by another "
                                 f"lm-eval model or an older cru-harness); give this model its own cache path")
    if theirs is not None and theirs != mine:
        differ = ", ".join(key for key in sorted(set(mine) | set(theirs)) if mine.get(key) != theirs.get(key))
        raise ModelArgumentError(f"{where}: written by another model (its {differ} differ); lm-eval keys "
                                 f"the cache by the requests alone, so give each base and router set its "
                                 f"own cache path")
    if theirs is None:
        db[CACHE_IDENTITY_KEY] = mine
        db.commit()
