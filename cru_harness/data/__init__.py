"""Benchmark data: TOFU and RWKU from the Hub by default, or from a local directory.

Local directories: `data_dir=` arguments, `CRU_HARNESS_TOFU_DIR` / `CRU_HARNESS_RWKU_DIR`, or
`CRU_HARNESS_DATA_DIR` (a folder holding `tofu/` and `rwku/`).
"""
from ..prompts import PLAIN_PROMPT
from .corpora import format_qa, format_qa_prompt, load_corpus, load_corpus_rows, row_qa, rows_to_texts
from .rwku import ICU_INSTRUCTION, RWKUTarget, get_target, list_targets, load_target_file, parse_targets
from .sources import DataSourceError, resolve_local_dir
from .tofu import TOFU_CONFIGS, load_idontknow, load_tofu, retain_config_for

__all__ = [
    "DataSourceError", "ICU_INSTRUCTION", "PLAIN_PROMPT", "format_qa_prompt", "RWKUTarget", "TOFU_CONFIGS", "format_qa", "get_target",
    "list_targets", "load_corpus", "load_corpus_rows", "load_idontknow", "load_target_file", "load_tofu", "parse_targets",
    "resolve_local_dir", "retain_config_for", "row_qa", "rows_to_texts",
]
