"""The identity attack: the cell's model as it is. It proves the attack path end to end (an attack cell's
numbers must equal those of the cell it attacks) and is the baseline row of a robustness table."""
from __future__ import annotations

from ..api import Attack, CellContext, Trained


class IdentityAttack(Attack):
    name = "identity"
    summary = "no attack: the cell's model as deployed (its scores equal the attacked cell's)"

    def run(self, ctx: CellContext) -> Trained:
        return Trained(ctx.model_path, routers=ctx.routers)


ATTACK = IdentityAttack()
