"""RWKU as a benchmark package (`plugin.RWKU`, registered as `rwku`): its unit (a target), corpora, evaluation and
lm-eval metadata keys, report columns. Its data loader (`cru_harness.data.rwku`), probe prompts
(`cru_harness.prompts`), target selection (`cru_harness.runner.targets`) and lm-eval tasks (`tasks/rwku`) sit in the
layers below or beside it (docs/extending.md)."""
from .plugin import BENCHMARK, RWKU, RWKU_COLUMNS, rwku_forget_all

__all__ = ["BENCHMARK", "RWKU", "RWKU_COLUMNS", "rwku_forget_all"]
