"""The built-in benchmarks (`cru_harness.api.Benchmark`, entry-point group `cru_harness.benchmarks`): TOFU and
RWKU. Their lm-eval tasks live in the task folders (`tasks/tofu`, `tasks/rwku`)."""
