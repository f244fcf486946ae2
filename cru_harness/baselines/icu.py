"""ICU (in-context unlearning, RWKU's baseline): no training. Every prompt is prefixed with RWKU's instruction
to behave as if the target were unknown (the benchmark's instruction); the method is scored by
running the ICU variants of the RWKU tasks on the unmodified model. It is registered so that method lists and
configs can name it; `unlearn()` refuses it with that explanation."""
from __future__ import annotations

from dataclasses import dataclass

from ..api import CellContext, Method, Trained
from .base import BaselineConfig, UnlearningMethod
from .registry import register_method


@dataclass
class ICUConfig(BaselineConfig):
    """No hyperparameters are used; the class exists so `preset()` works uniformly."""


@register_method
class ICU(UnlearningMethod):
    name = "icu"
    Config = ICUConfig
    trains = False
    # How the runner scores it: the original model, with the ICU variants of the RWKU tasks.
    task_variant = "icu"

    def compute_loss(self, model, batch, ref_model=None):
        raise RuntimeError("icu trains nothing: it is scored by the ICU task variants on the original model")


class ICUMethod(Method):
    """In-context unlearning: the original model, scored by the benchmark's ICU task variants (RWKU's
    `rwku_icu_*`, an instruction prefixed to every prompt): it runs where a benchmark has them."""

    name = "ICU"
    summary = "RWKU's in-context unlearning: an instruction prefixed to every prompt, nothing trained"
    seeded = False
    reads_corpora = False
    trains = False
    needs = ("nothing: prompt-only",)
    order = 70
    task_variant = ICU.task_variant

    def refuse_hparam(self, key: str) -> str:
        return ("ICU is prompt-only (RWKU's in-context unlearning instruction): it trains nothing, "
                "so training hyperparameters are meaningless")

    def unsupported(self, benchmark: str) -> str | None:
        from .. import plugins

        plugin = plugins.benchmarks.get(benchmark) if benchmark in plugins.benchmarks else None
        if plugin is None or not plugin.task_variants(tuple(plugin.default_tasks), self.task_variant):
            return (f"ICU cannot run on {benchmark}: it is a prompt-only in-context unlearning baseline, scored by "
                    "task variants that benchmark does not have (RWKU's)")
        return None

    def tasks_for(self, benchmark, tasks: tuple[str, ...]) -> tuple[str, ...]:
        """Each task's ICU variant where the benchmark has one (`rwku_x` -> `rwku_icu_x`), the others as given."""
        return tuple(variant for task in tasks
                     for variant in (benchmark.task_variants((task,), self.task_variant) or (task,)))

    def describe(self, cell) -> tuple[str | None, list[str]]:
        return "nothing (prompt-only: RWKU's ICU instruction prefixed to every prompt)", []

    def run(self, ctx: CellContext) -> Trained:
        ctx.outcome["resources"].update(train_wall_time_s=0.0, trainable_params=0)
        return Trained(ctx.model_path)


METHOD = ICUMethod()
