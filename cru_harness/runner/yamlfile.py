"""Moved to `cru_harness.yamlfile` (the foundation: every command reads YAML through it); kept for imports."""
from ..yamlfile import MAX_BYTES, MAX_DEPTH, MAX_NODES, BoundedSafeLoader, expanded_size, load_value, read_yaml  # noqa: F401
