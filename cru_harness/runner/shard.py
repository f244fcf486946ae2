"""`--shard i/n`: split a plan's cells across n processes, deterministically by cell hash.

Cell c belongs to shard `int(c.hash, 16) % n + 1` (shards are numbered 1..n). Every cell is in exactly one
shard whatever order the cells are listed in, and a cell keeps its shard when other cells are added.
"""
from __future__ import annotations

import re
from typing import Iterable, TypeVar

from ..errors import InputError

T = TypeVar("T")


def parse_shard(spec: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(spec))
    if not match:
        raise InputError(f"--shard expects i/n (e.g. 1/4), got {spec!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise InputError(f"--shard {spec}: need 1 <= i <= n (shards are numbered from 1)")
    return index, count


def shard_of(cell_hash: str, count: int) -> int:
    return int(cell_hash, 16) % count + 1


def select_shard(cells: Iterable[T], index: int, count: int) -> list[T]:
    return [cell for cell in cells if shard_of(cell.hash, count) == index]
