"""The detach attack: serve an adapter method's base without its router bundle.

An adapter method (CRU) leaves the base weights untouched and gates them at inference. Whoever holds the files
can load the base alone, so its forget scores fall back to the base model's. This is the trivial white-box
attack on any adapter-style unlearning (issue 51, item 6); reporting it states plainly that CRU's forgetting
lives in the bundle, not in the weights. For a method that changes the weights, and for the retain oracle, there is
nothing to detach: a plan makes no detach cell for them (their scores would be the cell's own). Run by hand on a
model without a bundle (`cru-harness attack`), it returns the model as deployed and records so in the details.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..api import Attack, CellContext, Trained


@dataclass
class DetachConfig:
    """No settings: the bundle is either served or not."""


class DetachAttack(Attack):
    name = "detach"
    summary = ("serve the base without the router bundle (adapter methods, e.g. CRU); the identity for a method "
               "that changes the weights")
    config = DetachConfig
    order = 110   # after identity (100), the baseline row of a robustness table

    def applies_to(self, method) -> bool:
        return method is not None and method.adapter

    def run(self, ctx: CellContext) -> Trained:
        ctx.outcome["details"]["detach"] = {
            "routers_removed": ctx.routers,
            "identity": ctx.routers is None,
            "note": ("the attacked model has no router bundle: the weights as deployed are evaluated (the identity)"
                     if ctx.routers is None else "the base evaluated without its router bundle"),
        }
        return Trained(ctx.model_path, routers=None)


ATTACK = DetachAttack()
