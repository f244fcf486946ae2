"""Issue 75's measure of how a cell runs (benchmarks/cell_path.py): the cell's path from `execute_cell` goes back into
a module it had already left at most half as often as before the plan settled the cell's decisions, in the source
and at run time, and it no longer passes through the modules that decide (`prompting`, `models`, `plan`)."""
import ast

import pytest

from conftest import REPO_ROOT, load_benchmark

#: benchmarks/results/cell_path.md's earlier code (4041b5a): re-entries in the source, and at run time.
BEFORE_SOURCE, BEFORE_RUN = 22, 10
DECIDING = ("runner.prompting", "runner.models", "runner.plan")


def test_the_cells_path_in_the_source_reenters_half_as_often_and_decides_nothing():
    path = load_benchmark("cell_path").static_path(REPO_ROOT)
    assert path["reentries"] <= BEFORE_SOURCE // 2, path
    assert not [call for call in path["trail"] if call.startswith(DECIDING)], path["trail"]
    assert path["trail"][0] == "runner.execute:execute_cell" and "runner.evaluation:score_cell" in path["trail"]


def test_the_source_count_sees_a_call_that_decides_again(tmp_path):
    """The count is not vacuous: an executor that asks `prompting` again for the cell's prompt format is caught."""
    import shutil

    copy = tmp_path / "cru_harness"
    shutil.copytree(REPO_ROOT / "cru_harness", copy, ignore=shutil.ignore_patterns("__pycache__"))
    execute = copy / "runner" / "execute.py"
    text = execute.read_text()
    text = text.replace("    chat = decisions.chat(model_path)\n",
                        "    from .prompting import use_chat_template\n\n"
                        "    chat = use_chat_template(cell, model_path)\n", 1)
    ast.parse(text)
    execute.write_text(text)
    path = load_benchmark("cell_path").static_path(tmp_path)
    assert "runner.prompting:use_chat_template" in path["trail"]


@pytest.mark.slow
def test_the_cells_path_at_run_time_reenters_half_as_often():
    """ci_minimal's GA cell, run once by `execute_cell`: every call that receives the cell."""
    path = load_benchmark("cell_path").trace(str(REPO_ROOT / "configs" / "ci_minimal.yaml"))
    assert path["reentries"] <= BEFORE_RUN // 2, path
    assert not [call for call in path["trail"] if call.startswith(DECIDING)], path["trail"]
    assert path["trail"][-1].endswith(":score")   # it ran to the benchmark's scorer
