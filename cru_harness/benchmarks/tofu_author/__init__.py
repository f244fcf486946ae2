"""LUNAR's one-author TOFU split as a benchmark package (`plugin.TOFUAuthor`, registered as `tofu_author`): TOFU's
data and tasks (`benchmarks/tofu/tasks/tofu_author_*.yaml`), its own unit (an author), corpora and deviation score."""
from .plugin import BENCHMARK, DEVIATION_NOTE, TOFU_AUTHOR_COLUMNS, TOFUAuthor, author_split

__all__ = ["BENCHMARK", "DEVIATION_NOTE", "TOFU_AUTHOR_COLUMNS", "TOFUAuthor", "author_split"]
