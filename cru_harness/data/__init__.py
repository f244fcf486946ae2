"""Benchmark data the layers share: corpora (files or a benchmark's named corpora) and where a benchmark's data
lives (`sources`: a local directory, else the Hub). Each benchmark's own loader sits in its package
(`cru_harness/benchmarks/<name>/data.py`) and is reached through its plugin's hooks.
"""
from ..prompts import PLAIN_PROMPT
from .corpora import format_qa, format_qa_prompt, load_corpus, load_corpus_rows, row_qa, rows_to_texts
from .sources import DataSourceError, resolve_local_dir

__all__ = [
    "DataSourceError", "PLAIN_PROMPT", "format_qa_prompt", "format_qa", "load_corpus", "load_corpus_rows",
    "resolve_local_dir", "row_qa", "rows_to_texts",
]
