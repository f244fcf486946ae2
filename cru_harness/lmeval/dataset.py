"""The project's tasks load their rows from Python (`custom_dataset` in their YAML: Hub or local copy, targets and
presets from `--metadata`). lm-eval 0.4.13 (`ConfigurableTask.download`) then warns "Custom kwargs can be passed to
`--metadata` ..." once per task of every run, a hint meant for tasks whose README it points to, which reads as a
fault when a suite prints it for each of its tasks. `QuietCustomDataset` loads such a dataset the same way, minus
that line; the tasks' READMEs document their metadata keys."""
from __future__ import annotations

from typing import Any, Callable


class QuietCustomDataset:
    """Mixin before `ConfigurableTask`: `download` calls the task's `custom_dataset` as lm-eval 0.4.13 does
    (`custom_dataset(**metadata, **dataset_kwargs)`), without its per-task hint; any other task config is left to
    lm-eval."""

    def download(self, dataset_kwargs: dict[str, Any] | None = None, **kwargs) -> None:
        if isinstance(self.config.custom_dataset, Callable):
            self.dataset = self.config.custom_dataset(**(self.config.metadata or {}),
                                                      **(self.config.dataset_kwargs or {}))
        else:
            super().download(dataset_kwargs, **kwargs)
