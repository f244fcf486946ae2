"""ICU (in-context unlearning, RWKU's baseline): no training. Every prompt is prefixed with RWKU's instruction
to behave as if the target were unknown (`cru_harness.benchmarks.rwku.data.ICU_INSTRUCTION`); the method is scored by
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
    """RWKU's in-context unlearning: the original model, scored by the `rwku_icu_*` task variants."""

    name = "ICU"
    summary = "RWKU's in-context unlearning: an instruction prefixed to every prompt, nothing trained"
    benchmarks = ("rwku",)
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
        if benchmark != "rwku":
            return f"ICU cannot run on {benchmark}: it is RWKU's prompt-only in-context unlearning baseline"
        return None

    def tasks(self, tasks: tuple[str, ...]) -> tuple[str, ...]:
        """RWKU's task variants that prefix the ICU instruction to every prompt (`rwku_x` -> `rwku_icu_x`)."""
        prefix = f"rwku_{self.task_variant}_"
        return tuple(t.replace("rwku_", prefix, 1) if t.startswith("rwku_") and not t.startswith(prefix) else t
                     for t in tasks)

    def describe(self, cell) -> tuple[str | None, list[str]]:
        return "nothing (prompt-only: RWKU's ICU instruction prefixed to every prompt)", []

    def run(self, ctx: CellContext) -> Trained:
        ctx.outcome["resources"].update(train_wall_time_s=0.0, trainable_params=0)
        return Trained(ctx.model_path)


METHOD = ICUMethod()
