"""Every way into lm-eval, each in a real subprocess (the installed console scripts and the `.pth` hook).

If an lm-eval upgrade breaks a route (registry layout, TaskManager signature, CLI), one of these fails.
Each lm-eval CLI start costs ~14 s (it indexes ~14.7k built-in tasks), so there are only a few.
"""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from test_lmeval_support import TASKS_DIR, console_script, run, shared_tiny_dir

pytestmark = pytest.mark.slow

LIMIT = "2"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return shared_tiny_dir(tmp_path_factory)


def _results(out_dir: Path) -> dict:
    files = sorted(out_dir.rglob("results_*.json"))
    assert files, f"no results_*.json under {out_dir}"
    return json.loads(files[-1].read_text())["results"]


def _cli_eval(script: str, model: str, model_args: str, tasks: str, out: Path, cwd: Path, env_extra=None):
    run([console_script(script), "--model", model, "--model_args", model_args, "--tasks", tasks,
         "--include_path", str(TASKS_DIR), "--device", "cpu", "--batch_size", "2", "--limit", LIMIT,
         "--output_path", str(out)], cwd=cwd, env_extra=env_extra)
    return _results(out)


def test_lm_eval_cli_cru_and_hf_agree(tiny_dir, tmp_path):
    """The literal `lm_eval --model cru` (via the .pth hook) and `--model hf` on the same tasks."""
    tasks = "cru_lmeval_test_mc,cru_lmeval_test_rolling,cru_lmeval_test_eos"
    cru = _cli_eval("lm_eval", "cru", f"base={tiny_dir}", tasks, tmp_path / "cru", tmp_path)
    hf = _cli_eval("lm_eval", "hf", f"pretrained={tiny_dir}", tasks, tmp_path / "hf", tmp_path)
    for task, metric in [("cru_lmeval_test_mc", "acc,none"), ("cru_lmeval_test_mc", "acc_norm,none"),
                         ("cru_lmeval_test_rolling", "word_perplexity,none")]:
        assert cru[task][metric] == hf[task][metric], (task, metric)
    assert cru["cru_lmeval_test_eos"]["has_stats,none"] == 1.0
    assert hf["cru_lmeval_test_eos"]["has_stats,none"] == 0.0  # hf returns plain tuples


def test_cru_eval_console_script_without_the_hook(tiny_dir, tmp_path):
    """`cru-eval` registers explicitly, so it works with the .pth hook switched off."""
    res = _cli_eval("cru-eval", "cru", f"base={tiny_dir}", "cru_lmeval_test_eos,cru_lmeval_test_gen",
                    tmp_path / "out", tmp_path, env_extra={"CRU_HARNESS_NO_LMEVAL_HOOK": "1"})
    assert res["cru_lmeval_test_eos"]["has_stats,none"] == 1.0
    assert "exact_match,none" in res["cru_lmeval_test_gen"]


def test_python_api_and_default_task_manager(tiny_dir, tmp_path):
    """`simple_evaluate(model="cru")` in a fresh interpreter; a default TaskManager sees built-in and project
    tasks; `hf` still resolves; with the hook off `cru` is unknown (so the hook is what did it)."""
    code = textwrap.dedent(f"""
        import json, sys
        import lm_eval
        from lm_eval.api.registry import get_model
        from lm_eval.tasks import TaskManager
        assert get_model("hf").__name__ == "HFLM"
        assert get_model("cru").__name__ == "CRULM"
        tm = TaskManager(include_path={str(TASKS_DIR)!r})
        names = set(tm.all_tasks)
        missing = [n for n in ("hellaswag", "arc_easy", "tofu_forget10", "rwku_aa", "cru_lmeval_test_eos")
                   if n not in names]
        assert not missing, missing
        out = lm_eval.simple_evaluate(model="cru", model_args={{"base": {str(tiny_dir)!r}}},
                                      tasks=["cru_lmeval_test_eos"], task_manager=tm, device="cpu", limit=2)
        print(json.dumps(out["results"]["cru_lmeval_test_eos"], default=float))
    """)
    proc = run([sys.executable, "-c", code], cwd=tmp_path)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["has_stats,none"] == 1.0

    off = textwrap.dedent("""
        from lm_eval.api.registry import get_model
        assert get_model("hf").__name__ == "HFLM"
        try:
            get_model("cru")
        except ValueError:
            print("cru-unknown")
    """)
    proc = run([sys.executable, "-c", off], cwd=tmp_path, env_extra={"CRU_HARNESS_NO_LMEVAL_HOOK": "1"})
    assert "cru-unknown" in proc.stdout
