"""What a run's attacks read, checked before any cell (issue 78, class 3): `run` and `run --dry-run` stop on the
first problem in one line naming the key, before any training. The attack knows what its cells read
(`Attack.check_inputs`), the benchmark what its tasks can vary (`Benchmark.task_variants`, through
`Attack.tasks_for`) and where its data is (`data.sources.resolve_local_dir`): nothing is downloaded."""
from __future__ import annotations

from typing import Any


def _data_is_local(benchmark, data_dir) -> bool:
    """Whether the benchmark's data is on this machine (a dry run reads nothing it would have to download)."""
    from ..data.sources import resolve_local_dir
    from ..errors import UserError

    if benchmark.data is None:
        return True
    try:
        return resolve_local_dir(benchmark, data_dir) is not None
    except UserError:   # a data_dir that does not hold the benchmark: its own check names it
        return False


def check_attack_inputs(config: Any, cells: list) -> list[str]:
    """Refuse (`ConfigError`, naming `attacks[i]` and the setting) an attack that would make no cell because no
    task of the run has its prompt variant, and the first input an attack cell would fail on. Returns one note per
    benchmark a prompt attack makes no cell on (its tasks have no variant), so that is said, not silent."""
    from .. import plugins
    from ..errors import excerpt
    from .config import ConfigError

    attacked = [cell for cell in cells if cell.kind in ("method", "retain")]
    notes = []
    for spec in config.attacks:
        attack = plugins.attacks.get(spec.attack)
        where = f"attacks[{spec.index}]"
        varied, tasks = False, set()
        for bench in sorted({cell.benchmark for cell in attacked}):
            bench_cells = [cell for cell in attacked if cell.benchmark == bench]
            benchmark = plugins.benchmarks.get(bench)
            # a benchmark without the variant gets no cell (documented: RWKU's AA probe is its paraphrase attack);
            # an attack that would make no cell at all is a mistake to say, not to drop
            here = any(attack.tasks_for(benchmark, cell.tasks, spec.settings) for cell in bench_cells)
            if not here:
                notes.append(f"note: {where} ({attack.name}) makes no cell on {bench}: none of its tasks has a "
                             f"{attack.name} variant")
            varied = varied or here
            tasks.update(f"{bench}: {task}" for cell in bench_cells for task in cell.tasks)
        if attacked and not varied:
            raise ConfigError(where, f"{attack.name} varies the prompts of tasks that have a variant, and none of the "
                              f"run's tasks ({excerpt(', '.join(sorted(tasks)), 200)}) has one: it would make no cell; "
                              "remove it or attack a benchmark whose tasks have one", config.source)
        checked = set()
        for cell in cells:
            if cell.kind != "attack" or cell.extra["attack"]["name"] != attack.name \
                    or not cell.label.endswith(f" + {spec.label}"):
                continue
            key = (cell.benchmark, cell.split, cell.target, cell.seed, cell.data_dir,
                   tuple(sorted(cell.corpora.items())))
            if key in checked:
                continue
            checked.add(key)
            problem = attack.check_inputs(cell, _data_is_local(plugins.benchmarks.get(cell.benchmark),
                                                               cell.data_dir))
            if problem is not None:
                setting, message = problem
                raise ConfigError(f"{where}.{setting}", message, config.source)
    return notes
