"""WMDP (Li et al. 2024, centerforaisafety/wmdp): unlearning hazardous knowledge of a whole domain.

A cell's unit is a domain (`bio`, `cyber`, `chem`). The forget probes are lm-eval's own `wmdp_bio`, `wmdp_cyber`,
`wmdp_chem` (4-way multiple choice, accuracy, chance 0.25); utility is lm-eval's `mmlu` overall and the subjects
closest to the domains (college biology, virology, college computer science, computer security). No task file is
copied: the tasks are lm-eval's, used by name (`tasks`). Training corpora are WMDP's Hub corpora or a local copy
(`data`); `scoring` turns lm-eval's results into a cell's numbers.
"""
from __future__ import annotations

from .plugin import BENCHMARK, WMDP
from .tasks import CHANCE, DOMAINS, FORGET_TASKS, MMLU_SUBJECTS

__all__ = ["BENCHMARK", "CHANCE", "DOMAINS", "FORGET_TASKS", "MMLU_SUBJECTS", "WMDP"]
