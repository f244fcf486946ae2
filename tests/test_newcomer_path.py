"""What a new user meets after the quickstart: the listings start fast, `run --dry-run` says where data comes from,
runs and outputs stay out of git, offline without data fails fast, and the tiny model's first build is not silent."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_listing_the_registries_imports_no_training_library():
    """`cru-harness methods` (and benchmarks, attacks) loads every registered plugin, but not transformers, peft,
    accelerate or bitsandbytes: their import was most of its 19 s (measured: benchmarks/results/stated_times.md)."""
    code = ("import contextlib, io, sys\nfrom cru_harness.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    assert main(['methods']) == 0 and main(['attacks']) == 0 and main(['benchmarks']) == 0\n"
            "assert 'NPO' in out.getvalue() and 'relearn' in out.getvalue()\n"
            "print(sorted(m for m in ('transformers', 'peft', 'accelerate', 'bitsandbytes', 'lm_eval', 'datasets')"
            " if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_the_packages_still_export_what_they_did():
    """The lazy package exports (cru_harness.cru, cru_harness.baselines) serve every name and submodule."""
    import cru_harness.baselines as baselines
    import cru_harness.cru as cru

    for name in cru.__all__:
        assert getattr(cru, name) is not None, name
    for name in baselines.__all__:
        assert getattr(baselines, name) is not None, name
    assert cru.train.train_routers is cru.train_routers and baselines.unlearn.__module__.endswith(".api")


def test_runs_and_outputs_of_the_readme_are_git_ignored(tmp_path):
    """The README writes `runs/` (unlearn, attack) and `out/` (lm_eval): not files to commit."""
    for path in ("runs/quickstart/router_bundle.json", "out/quickstart/results.json"):
        done = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO)
        assert done.returncode == 0, f"{path} is not ignored"


def test_the_tiny_models_first_build_says_so(tmp_path, monkeypatch, capsys):
    """A cold cache builds the tiny model for minutes: the resolver says so first (and shows its progress bar on a
    terminal); a built one resolves in silence."""
    from cru_harness.testbed import names, zoo

    built = zoo.tiny_checkpoint("llama")   # the shared cache's entry: the resolver finds it where the zoo put it
    assert names.zoo_entry_built("llama", "finetuned")
    assert names.resolve_model_path("zoo:llama:finetuned") == str(built)
    assert capsys.readouterr().err == ""
    calls = []
    monkeypatch.setenv("CRU_HARNESS_CACHE", str(tmp_path))   # an empty cache
    monkeypatch.setattr(zoo, "tiny_checkpoint", lambda arch, variant, progress=False: calls.append(progress) or "x")
    assert not names.zoo_entry_built("llama", "finetuned")
    assert names.resolve_model_path("zoo:llama:finetuned") == "x" and calls == [False]   # stderr is no terminal here
    assert "zoo:llama:finetuned: first use, building and fine-tuning the tiny model" in capsys.readouterr().err


def test_a_dry_run_names_the_data_directory_it_will_read(monkeypatch):
    """`run --dry-run` says which data directory each benchmark's data comes from, or that it is the Hub."""
    from cru_harness.runner.cli import data_source

    for name in ("CRU_HARNESS_DATA_DIR", "CRU_HARNESS_TOFU_DIR", "CRU_HARNESS_RWKU_DIR"):
        monkeypatch.delenv(name, raising=False)
    assert data_source("tofu", None) == ("the Hugging Face Hub (locuslab/TOFU): the config names no data_dir and "
                                         "neither CRU_HARNESS_TOFU_DIR nor CRU_HARNESS_DATA_DIR is set")
    monkeypatch.setenv("CRU_HARNESS_DATA_DIR", "../shared/data")
    assert data_source("rwku", None) == "../shared/data (from CRU_HARNESS_DATA_DIR)"
    monkeypatch.setenv("CRU_HARNESS_TOFU_DIR", "/d/tofu")
    assert data_source("tofu_author", None) == "/d/tofu (from CRU_HARNESS_TOFU_DIR)"
    assert data_source("tofu", "testbed:world") == "testbed:world (the config's data_dir)"


def test_without_network_or_data_the_hub_fails_at_once(monkeypatch):
    """No data directory and no connection to the Hub: the clear one-line error comes before the Hub client's five
    retries (about 40 s); in offline mode the client reads its cache and fails by itself, so no probe is made."""
    import datasets

    from cru_harness.benchmarks.tofu import data as tofu
    from cru_harness.data import sources

    asked = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: asked.append(args) or [{"question": "q", "answer": "a"}])
    monkeypatch.setattr(tofu, "resolve_local_dir", lambda name, data_dir=None: None)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(sources, "_hub_connection_problem", lambda: "no connection to huggingface.co:443 (DNS)")
    try:
        tofu.load_tofu("forget01")
    except sources.DataSourceError as err:
        message = str(err)
    assert "no connection to huggingface.co:443 (DNS); with a cached copy, set HF_HUB_OFFLINE=1" in message
    assert "CRU_HARNESS_DATA_DIR" in message and asked == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert tofu.load_tofu("forget01")[0]["answer"] == "a" and len(asked) == 1


def test_lm_evals_direction_warning_is_dropped_for_the_projects_groups_only(caplog):
    """tofu_forget10_suite puts forget10 (lower ROUGE-L is better) beside retain (higher is better): lm-eval warned
    four times a run that the group's directions differ, which the project's groups have by design. Another group
    with that mix still gets the warning."""
    import logging

    from lm_eval.evaluator_utils import _propagate_higher_is_better

    from cru_harness.lmeval.registration import patch_task_manager

    patch_task_manager()
    group = type("Group", (), {})
    ours, theirs = group(), group()
    ours.name, ours.child_names = "tofu_forget10_suite", ["tofu_forget10", "tofu_retain"]
    theirs.name, theirs.child_names = "someone_elses", ["tofu_forget10", "tofu_retain"]
    directions = {"tofu_forget10": {"rouge_l_recall": False}, "tofu_retain": {"rouge_l_recall": True}}
    with caplog.at_level(logging.WARNING, logger="lm_eval.evaluator_utils"):
        _propagate_higher_is_better([ours], dict(directions))
        assert "not consistent" not in caplog.text
        _propagate_higher_is_better([theirs], dict(directions))
        assert "metric rouge_l_recall in group someone_elses are not consistent" in caplog.text
