"""What a report says about the code behind its cells: their run records' code versions and commits, the cells
computed by another code version than this checkout's, those from a dirty tree, and the Hub revisions read."""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from ..fingerprints import code_version

LISTED = 10   # cells a report line names before it counts the rest: a 378-cell run stays readable


def listed(names: list[str]) -> str:
    """The first `LISTED` names, then how many more."""
    return "; ".join(names[:LISTED]) + (f"; and {len(names) - LISTED} more" if len(names) > LISTED else "")


def recorded_hub_revisions(record: dict | None) -> dict[str, str]:
    """A run record's `hub_revisions`, its well-formed entries only (a damaged record must not break a report)."""
    saved = (record or {}).get("hub_revisions")
    if not isinstance(saved, dict):
        return {}
    return {repo: revision for repo, revision in saved.items() if isinstance(repo, str) and isinstance(revision, str)}


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
    """Markdown lines for a report: which code computed the cells under `dirs`, which of them another code version
    than this checkout's computed (or none is recorded; a run recomputes them) and which come from a dirty tree."""
    from ..store import CellStore

    current = code_version()
    stale, dirty, records, invalid = 0, [], [], {}
    for directory in dirs:
        directory = Path(directory)
        # silent: the report's reading of the same cells (load_results) has already warned about bad files
        store = CellStore(directory.parent if directory.name == "cells" else directory, log=lambda _message: None)
        for cell_hash, result in store.iter_results():
            record = store.load_record(cell_hash) or {}
            records.append(record)
            label = f"{result.get('model')} {result.get('unit')} {result.get('label')} ({cell_hash})"
            stale += record_code(record)[0] != current
            if (record.get("git") or {}).get("dirty"):
                dirty.append(label)
        invalid.update(store.invalid)
    if not records and not invalid:
        return []
    total = len(records)
    # Everything that follows the checkout (its code version, which cells it would recompute) is on this one line:
    # `cru-harness report` on a committed run rewrites every other byte of its report (docs/reproducibility.md).
    if stale:
        checkout = (f"; {stale} of {total} cells were computed by another code version (below): their numbers "
                    "are what that code computed, and running the config again with this checkout would recompute "
                    "them.")
    else:
        checkout = "; it computed every cell."
    lines = ["## Provenance", "", f"This checkout's code version: {current}{checkout}"]
    if invalid:   # a cell the tables silently lacked would change them without a word
        named = "; ".join(f"{path} ({problem})" for path, problem in sorted(invalid.items()))
        lines.append(f"- **{len(invalid)} cell file(s) are not valid**: a cell whose result.json is among them is left "
                     f"out of every table, and `cru-harness run` recomputes it: {named}")
    counts = Counter(record_code(record)[0] for record in records)
    for version, commits in sorted(code_commits(records).items()):
        count = f"{counts[version]} cell{'s' * (counts[version] != 1)}"
        lines.append(f"- code version {version} ({count}): commit {', '.join(sorted(commits))}")
    if dirty:
        lines.append(f"- **{len(dirty)} cells come from a dirty tree** (uncommitted changes to the package): not "
                     "reproducible from any commit; do not commit them: " + listed(dirty))
    hub: dict[str, Counter] = defaultdict(Counter)
    for record in records:
        for repo, revision in recorded_hub_revisions(record).items():
            hub[repo][revision] += 1
    for repo, revisions in sorted(hub.items()):
        read = ", ".join(f"{revision[:12] if len(revision) == 40 else revision} ({count} cell{'s' * (count != 1)})"
                         for revision, count in sorted(revisions.items()))
        lines.append(f"- Hub {repo}: {read}" + (" — **more than one revision**" if len(revisions) > 1 else ""))
    return lines + [""]
