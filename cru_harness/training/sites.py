"""Where CRU gates act inside a decoder block (`RouterTrainingConfig.gate_site`).

- `"residual"` (the paper): coordinates of the block's output, the residual stream `h_l`.
- `"mlp"`: neurons of the block's MLP, i.e. the input of its down projection (`act(gate(x)) * up(x)` for
  Llama-style MLPs, `act(fc(x))` for GPT-2 / GPT-NeoX), the "knowledge neuron" site. Localization reads these
  activations; the router reads the block's *input* (the residual stream entering block l), which does not
  depend on the gates it produces.

The MLP is found by module names families share (no architecture-specific code beyond that list); a block
without one of them (a mixture-of-experts MLP, an unknown layout) is a `GateSiteError` naming the block.
"""
from __future__ import annotations

from torch import nn

from ..errors import UserError

GATE_SITES = ("residual", "mlp")
# The MLP's down projection in the families we know: Llama/Qwen2/Mistral/Phi-3 (`mlp.down_proj`), GPT-2
# (`mlp.c_proj`, a Conv1D), GPT-NeoX (`mlp.dense_4h_to_h`), OPT (`fc2`, directly in the block).
DOWN_PROJECTIONS = ("mlp.down_proj", "mlp.c_proj", "mlp.dense_4h_to_h", "mlp.fc2", "fc2")


class GateSiteError(UserError, ValueError):
    """The requested gate site does not exist in this model (e.g. no MLP down projection CRU can find)."""


def validate_gate_site(site: str) -> str:
    if site not in GATE_SITES:
        raise GateSiteError(f"gate_site must be one of {', '.join(GATE_SITES)}, got {site!r}")
    return site


def mlp_down_projection(block: nn.Module, index: int) -> nn.Module:
    """The down projection of block `index`'s MLP: the module whose input holds the MLP neurons."""
    for path in DOWN_PROJECTIONS:
        module = block
        for part in path.split("."):
            module = getattr(module, part, None)
            if not isinstance(module, nn.Module):
                break
        else:
            if mlp_width(module) is not None:
                return module
    raise GateSiteError(
        f"gate_site=mlp: cannot find the MLP down projection of decoder block {index} "
        f"({type(block).__name__}; looked for {', '.join(DOWN_PROJECTIONS)} as a dense layer); "
        "use gate_site=residual for this architecture")


def mlp_width(module: nn.Module) -> int | None:
    """Number of MLP neurons a down projection reads: `in_features` of a Linear, `nx` of a GPT-2 Conv1D."""
    if isinstance(module, nn.Linear):
        return module.in_features
    weight = getattr(module, "weight", None)
    if getattr(module, "nf", None) is not None and weight is not None and weight.dim() == 2:
        return int(weight.shape[0])  # transformers' Conv1D stores (in, out)
    return None


def site_width(blocks: nn.ModuleList, index: int, site: str, hidden: int) -> int:
    """How many coordinates block `index` offers at `site` (the hidden size for the residual stream)."""
    validate_gate_site(site)
    if site == "residual":
        return hidden
    return mlp_width(mlp_down_projection(blocks[index], index))
