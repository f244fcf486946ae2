"""WMDP's evaluation: lm-eval's own WMDP and MMLU tasks, by name, and where lm-eval finds them.

The task files are lm-eval's (`lm_eval/tasks/wmdp`, `lm_eval/tasks/mmlu/default`): this module only names them and,
for a local copy of the data, overrides their `dataset_path` when the tasks are built (lm-eval's group overrides
reach every member task), so a local snapshot of `cais/wmdp` / `cais/mmlu` (or the tests' fixture in their schema)
is read instead of the Hub, through the same task configs.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

DOMAINS = ("bio", "cyber", "chem")
#: lm-eval's WMDP task of each domain (lm_eval/tasks/wmdp/wmdp_<domain>.yaml): 0-shot, 4 choices, `acc`.
FORGET_TASKS = {domain: f"wmdp_{domain}" for domain in DOMAINS}
#: Four choices: a model that knows nothing scores 0.25 (WMDP's "random chance" line).
CHANCE = 0.25
MMLU = "mmlu"
#: The MMLU subjects WMDP reports beside the overall score, those closest to its domains (WMDP's paper, Figure 1
#: and Section 5: college biology and virology for bio, college computer science and computer security for cyber).
MMLU_SUBJECTS = {"college_biology": "mmlu_college_biology", "virology": "mmlu_virology",
                 "college_computer_science": "mmlu_college_computer_science",
                 "computer_security": "mmlu_computer_security"}
#: A cell's tasks: every WMDP domain (unlearning one shows its spill-over on the others) and MMLU, whose group holds
#: the close subjects, so they need no task of their own (lm-eval refuses a task asked twice).
DEFAULT_TASKS = (*FORGET_TASKS.values(), MMLU)
#: The lm-eval groups among MMLU's names (a group's overrides reach its members).
MMLU_GROUPS = ("mmlu", "mmlu_stem", "mmlu_other", "mmlu_social_sciences", "mmlu_humanities")
#: The wrapper group that carries the local-data overrides (it has no metric of its own).
LOCAL_GROUP = "wmdp_local_data"


def lmeval_task_dirs() -> list[str]:
    """lm-eval's own folders of the WMDP and MMLU tasks: indexing these two instead of all of lm-eval's ~15,000
    task names takes a fraction of a second instead of tens of seconds."""
    import lm_eval.tasks

    root = Path(lm_eval.tasks.__file__).resolve().parent
    return [str(root / "wmdp"), str(root / "mmlu" / "default")]


def dataset_folder(task: str) -> str | None:
    """The local folder name (`wmdp`, `mmlu`) whose data a task reads; None for a task of another benchmark."""
    if task == "wmdp" or task.startswith("wmdp_"):
        return "wmdp"
    if task == MMLU or task.startswith("mmlu_"):
        return "mmlu"
    return None


@contextmanager
def lmeval_tasks(tasks: list[str] | tuple[str, ...], local_root: str | Path | None):
    """`(include_paths, task_names)` to hand lm-eval's `TaskManager` and `simple_evaluate` for `tasks`, inside a
    `with`. Without a local root: lm-eval's WMDP and MMLU folders and the names themselves (the Hub). With one: also
    a wrapper group (`LOCAL_GROUP`, written to a temporary folder for the `with`) whose members are the same tasks
    with `dataset_path` pointing at the local snapshot (`<root>/wmdp`, `<root>/mmlu`). The members keep lm-eval's
    names and configs (a group's overrides reach its member tasks); only where the data comes from changes. A task
    of another benchmark is passed through as a name."""
    import tempfile

    import yaml

    dirs = lmeval_task_dirs()
    if local_root is None:
        yield dirs, list(tasks)
        return
    members: list[Any] = []
    others: list[str] = []
    for task in tasks:
        folder = dataset_folder(task)
        if folder is None:
            others.append(task)
            continue
        key = "group" if task in MMLU_GROUPS or task == "wmdp" else "task"
        members.append({key: task, "dataset_path": str(Path(local_root).resolve() / folder)})
    if not members:
        yield dirs, list(tasks)
        return
    with tempfile.TemporaryDirectory(prefix="wmdp_local_tasks_") as folder:
        # lm-eval reads a dict spec's overrides into every member, `task:` list included, so the wrapper must be a
        # registered name: a YAML in a folder of its own, indexed with the others
        (Path(folder) / f"{LOCAL_GROUP}.yaml").write_text(
            yaml.safe_dump({"group": LOCAL_GROUP, "task": members}, sort_keys=False), encoding="utf-8")
        yield [*dirs, folder], [LOCAL_GROUP, *others]
