"""PURGE's published checkpoints: `strzara/Phi-3-mini-4k-instruct-{i}_{Name}_PURGE`, one per RWKU target 1-20.

`{Name}` is the RWKU target folder name without its index (`10_Prince_Harry,_Duke_of_Sussex` ->
`Prince_Harry,_Duke_of_Sussex`). A comma is not valid in a Hub repo name, so such a target's checkpoint is
missing or renamed: we try candidates in order (as is; comma removed; the part before the comma; accents
folded) and, when the Hub is reachable, also search the author's repos for the `-{i}_..._PURGE` pattern.
A missing checkpoint or an unreachable Hub gives a `PurgeResolution` with status "unavailable" and a reason,
never an exception. A local path given in PURGE's method entry (`checkpoints: {1: /path}`) stands in for one.
"""
from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ...api import SettingError, CellContext, CellUnavailable, Method, Trained
from ...data.sources import DataSourceError

PURGE_AUTHOR = "strzara"
PURGE_PREFIX = "Phi-3-mini-4k-instruct"
PURGE_TARGETS = range(1, 21)

# RWKU's target folders 1-20 (from jinzhuoran/RWKU `Target/`), used when the data is not at hand (dry runs).
KNOWN_TARGET_FOLDERS = {
    1: "1_Stephen_King", 2: "2_Confucius", 3: "3_Bruce_Lee", 4: "4_Warren_Buffett", 5: "5_Christina_Aguilera",
    6: "6_Cindy_Crawford", 7: "7_Marie_Osmond", 8: "8_Paris_Hilton", 9: "9_Justin_Bieber",
    10: "10_Prince_Harry,_Duke_of_Sussex", 11: "11_Miley_Cyrus", 12: "12_Genghis_Khan", 13: "13_Liza_Minnelli",
    14: "14_Taylor_Swift", 15: "15_Mark_Cuban", 16: "16_Rhea_Perlman", 17: "17_Mark_Hamill",
    18: "18_John_D._Rockefeller", 19: "19_Alanis_Morissette", 20: "20_Marlon_Brando",
}


@dataclass
class PurgeResolution:
    target: int
    status: str                       # ok | unavailable
    path: str | None = None           # local snapshot directory
    repo_id: str | None = None        # the candidate that resolved (None for a local stand-in)
    tried: list[str] = field(default_factory=list)
    reason: str | None = None

    def to_dict(self) -> dict:
        return {"target": self.target, "status": self.status, "path": self.path, "repo_id": self.repo_id,
                "tried": self.tried, "reason": self.reason}


def target_folder(target: int, data_dir: str | os.PathLike | None = None, allow_hub: bool = False) -> str:
    """The RWKU folder name of a target: from the local data when available (or the Hub if `allow_hub`),
    else the known list of targets 1-20 (so dry runs never touch the network)."""
    try:
        from ...data.sources import resolve_local_dir
        from .data import get_target

        if resolve_local_dir("rwku", data_dir) is None and not allow_hub:
            raise LookupError("no local RWKU copy")
        return get_target(int(target), data_dir).folder
    except Exception:  # no local data (and no Hub): fall back to the names we know
        if int(target) in KNOWN_TARGET_FOLDERS:
            return KNOWN_TARGET_FOLDERS[int(target)]
        raise


def _fold_accents(text: str) -> str:
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()


def purge_candidates(target: int, folder: str | None = None) -> list[str]:
    """Repo ids to try for a target, most likely first (no duplicates)."""
    folder = folder or target_folder(target)
    match = re.fullmatch(r"(\d+)_(.+)", folder)
    if not match or int(match.group(1)) != int(target):
        raise ValueError(f"RWKU folder {folder!r} does not belong to target {target}")
    name = match.group(2)
    names = [name]
    if "," in name:
        names += [name.replace(",", ""), name.split(",")[0].rstrip("_"), name.replace(",", "_").replace("__", "_")]
    names += [_fold_accents(n) for n in names]
    seen, candidates = set(), []
    for n in names:
        repo = f"{PURGE_AUTHOR}/{PURGE_PREFIX}-{target}_{n}_PURGE"
        if n and repo not in seen:
            seen.add(repo)
            candidates.append(repo)
    return candidates


def _is_missing_repo(err: BaseException) -> bool:
    names = {cls.__name__ for cls in type(err).__mro__}
    return bool(names & {"RepositoryNotFoundError", "RevisionNotFoundError", "GatedRepoError",
                         "HFValidationError"})


def _is_offline(err: BaseException) -> bool:
    """The Hub could not be reached or answered with an HTTP error: external, the checkpoint is unavailable."""
    names = {cls.__name__ for cls in type(err).__mro__}
    return bool(names & {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectionError", "ConnectError",
                         "Timeout", "TimeoutException", "ProxyError", "HfHubHTTPError", "HTTPError"})


def _hub_offline_flag() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve_purge_checkpoint(target: int, *, local_path: str | os.PathLike | None = None,
                             data_dir: str | os.PathLike | None = None, cache_dir: str | None = None,
                             snapshot_download: Callable | None = None,
                             list_repos: Callable[[], list[str]] | None = None) -> PurgeResolution:
    """Find and download (through the Hugging Face cache) the PURGE checkpoint of one RWKU target.

    `snapshot_download` / `list_repos` default to huggingface_hub's; tests inject fakes. Never raises for a
    missing checkpoint or an unreachable Hub: the resolution says "unavailable" and why.
    """
    target = int(target)
    if local_path is not None:
        path = Path(local_path).expanduser()
        model = model_dir(path) if path.is_dir() else None
        if model is not None:
            return PurgeResolution(target, "ok", path=str(model), tried=[str(path)])
        return PurgeResolution(target, "unavailable", tried=[str(path)],
                               reason=f"local PURGE checkpoint {path} is not a model directory ({NO_MODEL})")
    if target not in PURGE_TARGETS:
        return PurgeResolution(target, "unavailable",
                               reason=f"PURGE released checkpoints for RWKU targets 1-20 only, not {target}")
    try:
        candidates = purge_candidates(target, target_folder(target, data_dir))
    except (DataSourceError, LookupError) as err:   # no local RWKU copy and no Hub to name the target by
        return PurgeResolution(target, "unavailable", reason=f"cannot name target {target}'s checkpoint: {err}")
    if snapshot_download is None:
        from huggingface_hub import snapshot_download

    tried: list[str] = []
    offline_errors: list[str] = []
    missing: list[str] = []
    unusable: list[str] = []

    def attempt(repo: str) -> PurgeResolution | None:
        tried.append(repo)
        try:
            path = snapshot_download(repo_id=repo, cache_dir=cache_dir)
        except Exception as err:
            if _is_missing_repo(err):
                missing.append(repo)
            elif _is_offline(err) or _hub_offline_flag():
                offline_errors.append(f"{repo}: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
                                      if str(err) else f"{repo}: {type(err).__name__}")
            else:   # a local failure (disk, permissions) or a bug: the cell fails with it, not "unavailable"
                raise
            return None
        model = model_dir(Path(path))
        if model is None:
            unusable.append(repo)
            return None
        return PurgeResolution(target, "ok", path=str(model), repo_id=repo, tried=list(tried))

    for repo in candidates:
        found = attempt(repo)
        if found:
            return found
    # Renamed? When the Hub answers, look through the author's repos for this target's pattern.
    if not offline_errors and not _hub_offline_flag():
        try:
            names = list_repos() if list_repos else _list_author_repos()
        except Exception as err:
            if not _is_offline(err):
                raise
            offline_errors.append(f"listing {PURGE_AUTHOR}'s repos: {type(err).__name__}")
            names = []
        pattern = re.compile(rf"{re.escape(PURGE_AUTHOR)}/{re.escape(PURGE_PREFIX)}-{target}_.+_PURGE", re.I)
        for repo in names:
            if pattern.fullmatch(repo) and repo not in tried:
                found = attempt(repo)
                if found:
                    return found
    if unusable:
        return PurgeResolution(target, "unavailable", tried=tried, reason=(
            f"PURGE checkpoint of target {target} downloaded but {', '.join(unusable)} holds no one model "
            f"({NO_MODEL}). Give a local copy in PURGE's method entry: `checkpoints: {{{target}: /path}}`"))
    if offline_errors:
        hint = " (HF_HUB_OFFLINE is set)" if _hub_offline_flag() else ""
        reason = (f"Hugging Face Hub unreachable{hint} and the checkpoint is not in the local cache; tried "
                  f"{', '.join(tried)}. Give a local copy in PURGE's method entry: `checkpoints: {{{target}: /path}}`. "
                  f"Errors: {'; '.join(offline_errors[:3])}")
    else:
        reason = (f"no PURGE checkpoint published for target {target}: none of {', '.join(tried)} exists on the Hub")
    return PurgeResolution(target, "unavailable", tried=tried, reason=reason)


NO_MODEL = "no config.json at its root, nor in exactly one folder below it"


def model_dir(path: Path) -> Path | None:
    """The model in a checkpoint directory (downloaded or local): its root, or the one folder below it holding
    config.json (a repo uploaded as its trainer's `checkpoint-N/` folder); None when neither holds one, or when
    several folders do (which one is meant cannot be told)."""
    if (path / "config.json").is_file():
        return path
    found = sorted(config.parent for config in path.glob("*/config.json"))
    return found[0] if len(found) == 1 else None


def _list_author_repos() -> list[str]:
    from huggingface_hub import HfApi

    return [model.id for model in HfApi().list_models(author=PURGE_AUTHOR, search="PURGE")]


class PurgeMethod(Method):
    """PURGE's published checkpoints as a method: nothing is trained, one checkpoint per RWKU target 1-20 is
    fetched (or given locally: its entry's `checkpoints: {target: path}`) and evaluated."""

    name = "PURGE"
    summary = "the PURGE authors' published unlearned checkpoints (Phi-3-mini-4k-instruct, RWKU targets 1-20)"
    benchmarks = ("rwku",)
    seeded = False
    reads_corpora = False
    trains = False
    needs = ("published checkpoints (Hub, or its entry's checkpoints)",)
    entry_settings = {"checkpoints": "{target: local path}: stand-ins for the published checkpoints"}
    moved_keys = {"purge_checkpoints": "checkpoints"}   # a top-level key before the checkpoints joined the entry
    base_model = PURGE_PREFIX
    order = 80

    def refuse_hparam(self, key: str) -> str:
        return "PURGE uses the published checkpoints: it has no hyperparameters"

    def unsupported(self, benchmark: str) -> str | None:
        if benchmark != "rwku":
            return (f"PURGE cannot run on {benchmark}: its published checkpoints are RWKU-only "
                    f"(Phi-3-mini-4k-instruct, one per target 1-20)")
        return None

    def read_settings(self, values: dict) -> dict:
        """`checkpoints: {target: local path}`, targets 1-20 (as integers)."""
        checkpoints = values.get("checkpoints")
        if checkpoints is None:
            return {}
        if not isinstance(checkpoints, dict):
            raise SettingError("checkpoints", "expected a mapping {target index: local path}")
        read: dict[int, str] = {}
        for key, value in checkpoints.items():
            try:
                index = int(key)
            except (TypeError, ValueError):
                raise SettingError(f"checkpoints.{key}", "keys are RWKU target indices (1-20)") from None
            if index not in PURGE_TARGETS:
                raise SettingError(f"checkpoints.{key}", "PURGE checkpoints exist for RWKU targets 1-20 only")
            if not isinstance(value, str):
                raise SettingError(f"checkpoints.{key}", f"expected a local path, got {value!r}")
            read[index] = value
        return {"checkpoints": read}

    def check_config(self, config, where: str) -> tuple[str, str] | None:
        """Every configured target has a checkpoint, on a model the checkpoints were fine-tuned from (or local
        stand-ins for every target). `config`: the validated parts (`benchmarks`, `models`, the entry's
        `settings`)."""
        if "rwku" not in config.benchmarks:
            return f"{where}.method", self.unsupported("tofu")
        targets = config.benchmarks["rwku"]["targets"]
        beyond = [t for t in targets if t not in PURGE_TARGETS]
        if beyond:
            return ("benchmarks.rwku.targets", f"PURGE (methods) has checkpoints for targets 1-20 only; "
                    f"targets {beyond} have none (restrict targets or drop PURGE)")
        local = config.settings.get("checkpoints", {})
        for j, model in enumerate(config.models):
            if "rwku" not in model.benchmarks:
                continue
            if PURGE_PREFIX.lower() not in model.path.lower() and not all(t in local for t in targets):
                return (f"models[{j}].path", f"PURGE's checkpoints are {PURGE_PREFIX} fine-tunes; model "
                        f"{model.name!r} ({model.path}) is not, so PURGE cannot be compared on it "
                        f"(give {where}.checkpoints for every target, or restrict the model to tofu)")
        return None

    def cell_extra(self, config, benchmark, split, target, settings=None) -> dict:
        local = (settings or {}).get("checkpoints", {})
        return {"purge_local_checkpoint": local[target]} if target in local else {}

    def entry_paths(self, settings) -> list[tuple[str, str, str]]:
        """(key under the entry, what it is, path) of every local checkpoint it loads (the run's security summary)."""
        return [(f"checkpoints.{t}", f"PURGE target {t}", path)
                for t, path in sorted((settings.get("checkpoints") or {}).items())]

    def describe(self, cell) -> tuple[str | None, list[str]]:
        local = cell.extra.get("purge_local_checkpoint")
        return None, ([f"PURGE checkpoint (local) {local}"] if local else
                      ["PURGE checkpoint, first found of: " + ", ".join(purge_candidates(cell.target))])

    def run(self, ctx: CellContext) -> Trained:
        cell = ctx.cell
        resolution = resolve_purge_checkpoint(cell.target, local_path=cell.extra.get("purge_local_checkpoint"),
                                              data_dir=ctx.data_dir)
        ctx.outcome["details"]["purge"] = resolution.to_dict()
        if resolution.status != "ok":
            raise CellUnavailable(resolution.reason, {"purge": resolution.to_dict()})
        return Trained(resolution.path)


METHOD = PurgeMethod()
