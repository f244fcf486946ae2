"""The attacks on the prompts, not the model (`paraphrase`, `in_context`): each returns the deployed model as it
is and names the task variants its cells are evaluated with (TOFU's forget task `tofu_forgetXX` ->
`tofu_forgetXX_<variant>`, in `tasks/tofu`). The variants ask differently; the scored answers and the scorer stay
the attacked cell's, so an attack cell's numbers feed the robustness table as any attack's. A run's attack cell
evaluates the variants only: the cell's other tasks would score the attacked cell's model on its own questions,
the attacked cell's numbers. A benchmark without such a variant (RWKU; TOFU's one-author split) gets no attack cell:
its numbers would be the attacked cell's, known beforehand.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from ..api import Attack, CellContext, Trained

_FORGET = re.compile(r"tofu_(forget\d\d)")
_SUITE = re.compile(r"tofu_(forget\d\d)_suite")
#: What a `tofu_forgetXX_suite` group holds beside its forget task (tasks/tofu/tofu_forgetXX_suite.yaml).
SUITE_UTILITY_TASKS = ("tofu_retain", "tofu_real_authors", "tofu_world_facts")


def variant_tasks(tasks: tuple[str, ...], variant: str) -> tuple[str, ...]:
    """`tasks` with each TOFU forget task replaced by its `variant` (a suite group by its members, the forget one
    replaced: lm-eval cannot swap one task inside a group); every other task unchanged."""
    out: list[str] = []
    for task in tasks:
        if _FORGET.fullmatch(task):
            out.append(f"{task}_{variant}")
        elif (suite := _SUITE.fullmatch(task)):
            out.extend((f"tofu_{suite.group(1)}_{variant}", *SUITE_UTILITY_TASKS))
        else:
            out.append(task)
    return tuple(dict.fromkeys(out))


class PromptAttack(Attack):
    """An attack whose task variants ask the attacked model differently (subclasses set `variant`)."""

    variant = ""

    def tasks(self, tasks: tuple[str, ...], settings: Mapping[str, Any]) -> tuple[str, ...]:
        """The variants alone: a task the attack leaves as it is would ask the attacked cell's model the attacked
        cell's questions, so its numbers are the attacked cell's (no cell re-scores them). Without a variant
        (RWKU), none: the plan makes no cell."""
        return tuple(task for task in variant_tasks(tasks, self.variant) if task not in tasks
                     and task not in SUITE_UTILITY_TASKS)

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
