"""TOFU as a benchmark package: its plugin (`plugin.TOFU`, registered as `tofu`), its data loader (`data`), report
blocks (`report`), report columns and oracle. Importing the package stays light: lm-eval's task code imports
`data` alone, and the plugin (with the report layers it reads) loads on first use of its names (PEP 562)."""
from ...lazy import lazy_exports

_LAZY = {name: ".plugin" for name in
         ("BENCHMARK", "TOFU", "TOFU_COLUMNS", "retain_from_per_item", "strongest_attack", "variant_tasks")}
__getattr__ = lazy_exports(__name__, globals(), _LAZY)

__all__ = list(_LAZY)
