"""The CRU objective on gate values (`cru_method.md`, "Phase 2"; paper appendix "loss shape"):

    L = mean_l f(forget gate mean_l) + lam * mean_l r(retain gate mean_l)

The paper pairs a linear suppress term f(w) = w with a quadratic pass term r(w) = (w - 1)^2 and argues for the
asymmetry without running the alternatives; `suppress_loss="quadratic"` (f(w) = w^2) and `pass_loss="linear"`
(r(w) = 1 - w) give the other three combinations of that ablation. A router that cannot tell the corpora apart
settles at w* = 1 - 1/(2 lam) (paper), lam / (1 + lam) (quadratic, quadratic), lam / 2 (quadratic, linear), and at
an end of [0, 1] (linear, linear).
"""
from __future__ import annotations

import torch

from ..errors import InputError

LOSS_SHAPES = ("linear", "quadratic")


def validate_loss_shape(name: str, shape: str) -> str:
    if shape not in LOSS_SHAPES:
        raise InputError(f"{name} must be one of {', '.join(LOSS_SHAPES)}, got {shape!r}")
    return shape


def cru_loss(forget_means: dict[int, torch.Tensor], retain_means: dict[int, torch.Tensor], lam: float, *,
             suppress_loss: str = "linear", pass_loss: str = "quadratic") -> torch.Tensor:
    """`mean_l f(forget gate mean) + lam * mean_l r(retain gate mean)`; defaults: f(w) = w, r(w) = (w - 1)^2."""
    validate_loss_shape("suppress_loss", suppress_loss)
    validate_loss_shape("pass_loss", pass_loss)
    device = next(iter(forget_means.values())).device  # blocks of a split model sit on several devices
    if suppress_loss == "linear":
        suppress = torch.stack([m.to(device) for m in forget_means.values()]).mean()
    else:
        suppress = torch.stack([m.to(device) ** 2 for m in forget_means.values()]).mean()
    if pass_loss == "quadratic":
        keep = torch.stack([(m.to(device) - 1.0) ** 2 for m in retain_means.values()]).mean()
    else:
        keep = torch.stack([1.0 - m.to(device) for m in retain_means.values()]).mean()
    return suppress + lam * keep


def collapsed_gate(lam: float, *, suppress_loss: str = "linear", pass_loss: str = "quadratic") -> float:
    """The gate a router that cannot tell the corpora apart settles at: the minimiser over [0, 1] of
    f(w) + lam * r(w) (paper, Propositions on the tied gate and on the loss shapes). NaN where every w is optimal
    (both terms linear at lam = 1). The line the lambda and loss-shape studies draw on their gate plots."""
    validate_loss_shape("suppress_loss", suppress_loss)
    validate_loss_shape("pass_loss", pass_loss)
    if not lam >= 0:
        raise InputError(f"lam must be non-negative, got {lam!r}")
    if (suppress_loss, pass_loss) == ("linear", "linear"):  # (1 - lam) w + lam: affine, an end of the box
        return float("nan") if lam == 1 else (0.0 if lam < 1 else 1.0)
    if (suppress_loss, pass_loss) == ("linear", "quadratic"):
        unclipped = 1.0 - 1.0 / (2.0 * lam) if lam > 0 else float("-inf")
    elif (suppress_loss, pass_loss) == ("quadratic", "quadratic"):
        unclipped = lam / (1.0 + lam)
    else:  # quadratic forget, linear retain
        unclipped = lam / 2.0
    return min(max(unclipped, 0.0), 1.0)
