"""TOFU as a benchmark package: its plugin (`plugin.TOFU`, registered as `tofu`), its report columns and oracle.
Its data loader (`cru_harness.data.tofu`), prompt presets (`cru_harness.prompts`), scorer (`cru_harness.scoring`)
and lm-eval tasks (`tasks/tofu`) sit in the layers below, which the lm-eval task code and the trainers import too
(docs/extending.md)."""
from .plugin import BENCHMARK, TOFU, TOFU_COLUMNS, retain_from_per_item, strongest_attack, variant_tasks

__all__ = ["BENCHMARK", "TOFU", "TOFU_COLUMNS", "retain_from_per_item", "strongest_attack", "variant_tasks"]
