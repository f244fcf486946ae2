"""Name -> method class. Each method module registers itself with `@register_method`; importing the
package imports them all, so `METHODS` is complete once `cru_harness.baselines` is imported."""
from __future__ import annotations

from .base import UnlearningMethod

METHODS: dict[str, type[UnlearningMethod]] = {}


def register_method(cls: type[UnlearningMethod]) -> type[UnlearningMethod]:
    """Class decorator: register `cls` under `cls.name` (lower case). A name can be registered once."""
    if not (isinstance(cls, type) and issubclass(cls, UnlearningMethod)):
        raise TypeError(f"register_method expects an UnlearningMethod subclass, got {cls!r}")
    name = cls.name.lower()
    if not name:
        raise ValueError(f"{cls.__name__} has no `name`")
    if name in METHODS and METHODS[name] is not cls:
        raise ValueError(f"method {name!r} is already registered by {METHODS[name].__qualname__}")
    METHODS[name] = cls
    return cls


def get_method(name: str) -> type[UnlearningMethod]:
    """The method class registered as `name` (case-insensitive; a runner method name or another name of it, as
    `GradAscent`, works too); unknown -> KeyError listing the methods."""
    _ensure_loaded()
    key = str(name).lower()
    if key not in METHODS:
        # a method's registered name or another name of it (`CE-U`, open-unlearning's `GradAscent`)
        from .. import plugins

        trainer = getattr(plugins.methods.get(name), "trainer", None) if name in plugins.methods else None
        if trainer is not None and trainer.name.lower() in METHODS:
            return trainer
        raise KeyError(f"unknown unlearning method {name!r}; available: {', '.join(sorted(METHODS))}")
    return METHODS[key]


def benchmark_defaults(method: str, benchmark: str | None, split: str | None, given=()) -> dict:
    """A benchmark's defaults for a method (`api.Benchmark.method_defaults`, by the method's runner name: `GA`) on a
    unit; {} for no benchmark. `given`: the keys set on top."""
    if benchmark is None:
        return {}
    from .. import plugins

    return plugins.benchmarks.get(benchmark).method_defaults(method, split, tuple(given))


def make_config(name: str, benchmark: str | None = None, split: str | None = None, **overrides):
    """The config of method `name` for a benchmark / unit: the benchmark's defaults for it, then the overrides; no
    benchmark: the dataclass's defaults (TOFU's protocol)."""
    from .. import plugins

    trainer = get_method(name)
    runner = next((m.name for m in plugins.methods if getattr(m, "trainer", None) is trainer), trainer.name)
    return trainer.Config.with_defaults(benchmark_defaults(runner, benchmark, split, overrides), **overrides)


def _ensure_loaded() -> None:
    from . import (  # noqa: F401  (registration side effects)
        ceu, dpo, ga, gd, gd_kl, icu, idkdpo, lunar, npo, npo_kl, rmu, rt, satimp, simnpo, task_vector, undial, wga, whp)
