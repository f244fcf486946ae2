"""The in-context attack: k forget question-answer pairs before each held-out forget question.

TOFU: the forget task's `tofu_forgetXX_in_context` variant splits the forget file as `relearn` splits its forget
corpus (`data.slices.forget_slice`, the attacked cell's seed: one seed, one split), and asks only the held-out
questions, each after `k` pairs drawn from the slice (`data.slices.in_context_shots`), written as the preset writes
a question and its answer (chat: one user and one assistant turn per pair). Only held-out items are scored, so no
item is shown its own answer. RWKU has no variant: it gets no in_context cell.

Defaults: k = 5, the 5-shot prompts of Doshi & Cooper Stickland 2024 (arXiv:2411.12103), where 5 in-context
examples brought back much of what unlearning removed; the slice is relearn's (a quarter of the forget items),
the held-out framing of Hu et al. 2024 (arXiv:2406.13356). The papers draw their examples from other data (a
benchmark's dev split); drawing them from the forget slice is this project's choice, so that in_context and
relearn show the model the same items.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..api import CellContext, Trained
from ..data.slices import DEFAULT_IN_CONTEXT_K, DEFAULT_SLICE_FRACTION, check_slice_settings, forget_slice
from ..errors import InputError
from .prompt_variants import PromptAttack

#: More pairs than this no model's context holds (a TOFU pair is ~60 tokens).
MAX_K = 256


@dataclass
class InContextConfig:
    """`k`: pairs before each held-out question. `slice_fraction` / `slice_size`: the slice they are drawn from,
    as relearn's (the rest is held out and scored)."""
    k: int = DEFAULT_IN_CONTEXT_K
    slice_fraction: float = DEFAULT_SLICE_FRACTION
    slice_size: int | None = None

    def __post_init__(self):
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= MAX_K:
            raise InputError(f"k must be an integer in [1, {MAX_K}], got {self.k!r}")
        check_slice_settings(self.slice_fraction, self.slice_size)


class InContextAttack(PromptAttack):
    name = "in_context"
    summary = "k forget question-answer pairs from relearn's slice before each held-out forget question"
    config = InContextConfig
    seeded = True   # the slice and the pairs follow the attacked cell's seed
    variant = "in_context"
    order = 135

    def task_metadata(self, settings: Mapping[str, Any], seed: int | None) -> dict[str, Any]:
        config = InContextConfig(**settings)
        metadata = {"k": config.k, "slice_fraction": config.slice_fraction, "seed": seed or 0}
        if config.slice_size is not None:
            metadata["slice_size"] = config.slice_size
        return metadata

    def check_inputs(self, cell, local: bool) -> tuple[str, str] | None:
        """The slice against the forget task's items (`Benchmark.forget_items`), when the data is here."""
        from .. import plugins
        from ..errors import UserError

        if not local:
            return None
        config = InContextConfig(**cell.extra["attack"]["settings"])
        try:
            found = plugins.benchmarks.get(cell.benchmark).forget_items(cell, cell.data_dir)
            if found is not None:
                forget_slice(len(found[0]), fraction=config.slice_fraction, size=config.slice_size,
                             seed=cell.seed or 0, what=self.name)
        except UserError as err:
            return "slice_size" if config.slice_size is not None else "slice_fraction", str(err)
        return None

    def run(self, ctx: CellContext) -> Trained:
        """The model as deployed; the slice's questions are recorded (`details.in_context.slice_questions`), drawn
        as the task variant draws them from the split's evaluation file, so the report reads the attacked and
        reference cells on the same held-out items as this cell."""
        trained = super().run(ctx)
        details = ctx.outcome["details"][self.name]
        if details["variant_tasks"] and getattr(ctx.cell, "benchmark", None):
            from .. import plugins

            found = plugins.benchmarks.get(ctx.cell.benchmark).forget_items(ctx.cell, ctx.data_dir)
            if found is None:
                return trained
            config = InContextConfig(**ctx.cell.extra["attack"]["settings"])
            rows = found[0]
            chosen, _ = forget_slice(len(rows), fraction=config.slice_fraction, size=config.slice_size,
                                     seed=ctx.cell.seed or 0, what=self.name)
            details["slice_questions"] = [rows[i]["question"] for i in chosen]
        return trained


ATTACK = InContextAttack()
