"""The built-in benchmarks (`cru_harness.api.Benchmark`, entry-point group `cru_harness.benchmarks`), one package
each (`tofu`, `tofu_author`, `rwku`, `wmdp`, `muse`); each package's lm-eval tasks live in its `tasks/` folder."""

from .. import plugins as _plugins
from .. import store as _store


def _benchmark_range(benchmark: str, metric: str):
    """A registered benchmark's own range of a metric (`api.Benchmark.metric_range`); None for an unknown one."""
    found = next((plugin for plugin in _plugins.benchmarks if plugin.name == benchmark), None)
    return found.metric_range(metric) if found is not None else None


# every benchmark plugin (the built-ins import this package) makes the store check its metrics' own ranges
_store.register_benchmark_ranges(_benchmark_range)
