"""RWKU as a benchmark package (`plugin.RWKU`, registered as `rwku`): its unit (a target), data loader (`data`),
corpora, evaluation and lm-eval metadata keys, report columns and blocks (`report`). Importing the package stays
light: lm-eval's task code imports `data` alone, and the plugin loads on first use of its names (PEP 562)."""
from ...lazy import lazy_exports

_LAZY = {name: ".plugin" for name in ("BENCHMARK", "RWKU", "RWKU_COLUMNS", "rwku_forget_all")}
__getattr__ = lazy_exports(__name__, globals(), _LAZY)

__all__ = list(_LAZY)
