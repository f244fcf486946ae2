"""The attacks on the prompts, not the model (`paraphrase`, `in_context`): each returns the deployed model as it
is and names the task variants its cells are evaluated with, which the attacked cell's benchmark gives
(`Benchmark.task_variants`: TOFU's forget task `tofu_forgetXX` -> `tofu_forgetXX_<variant>`, in `benchmarks/tofu/tasks`). The
variants ask differently; the scored answers and the scorer stay the attacked cell's, so an attack cell's numbers
feed the robustness table as any attack's. A run's attack cell evaluates the variants only: the cell's other tasks
would score the attacked cell's model on its own questions, the attacked cell's numbers. A benchmark without such a
variant (RWKU; TOFU's one-author split) gets no attack cell: its numbers would be the attacked cell's, known
beforehand.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..api import Attack, Benchmark, CellContext, Trained


class PromptAttack(Attack):
    """An attack whose task variants ask the attacked model differently (subclasses set `variant`)."""

    variant = ""

    def tasks_for(self, benchmark: Benchmark, tasks: tuple[str, ...], settings: Mapping[str, Any]
                  ) -> tuple[str, ...]:
        """The variants alone (`Benchmark.task_variants`): a task the attack leaves as it is would ask the attacked
        cell's model the attacked cell's questions, so its numbers are the attacked cell's (no cell re-scores
        them). Without a variant (RWKU), none: the plan makes no cell."""
        return tuple(benchmark.task_variants(tuple(tasks), self.variant))

    def tasks(self, tasks: tuple[str, ...], settings: Mapping[str, Any]) -> tuple[str, ...]:
        """Of any registered benchmark's tasks (`cru-harness attack` names no benchmark): the first that has
        variants of them."""
        from .. import plugins

        for benchmark in plugins.benchmarks:
            if (found := self.tasks_for(benchmark, tasks, settings)):
                return found
        return ()

    def run(self, ctx: CellContext) -> Trained:
        tasks = getattr(ctx.cell, "tasks", None)   # a runner cell's; `cru-harness attack` evaluates nothing
        variants = [task for task in tasks or () if task.endswith(f"_{self.variant}")]
        if tasks is None:
            note = f"the model as it is: evaluate it with the {self.variant} task variants"
        else:
            note = f"the model as deployed, asked through the {self.variant} task variants"
        ctx.outcome["details"][self.name] = {
            "variant_tasks": variants,
            "task_metadata": self.task_metadata(ctx.cell.extra["attack"]["settings"], ctx.cell.seed),
            "note": note,
        }
        return Trained(ctx.model_path, routers=ctx.routers)
