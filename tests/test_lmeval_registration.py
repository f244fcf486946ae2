"""Registration pieces in-process: the start-up finder, `register()`, the TaskManager patch, `tasks_dir()`."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from cru_harness.lmeval import registration

HOOK_FILE = Path(registration.__file__).with_name("_hook.py")


def _load_hook_copy():
    spec = importlib.util.spec_from_file_location("_cru_hook_under_test", HOOK_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_hook_is_stdlib_only():
    source = HOOK_FILE.read_text()
    top_imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert top_imports == ["from __future__ import annotations", "import os", "import sys"]


def test_finder_runs_action_after_the_watched_module_executes(tmp_path, monkeypatch):
    pkg = tmp_path / "cru_fake_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "watched.py").write_text("VALUE = 41\n")
    (pkg / "other.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    hook = _load_hook_copy()
    seen = []
    monkeypatch.setattr(hook, "_ACTIONS", {"cru_fake_pkg.watched": lambda: seen.append(
        sys.modules["cru_fake_pkg.watched"].VALUE + 1)})
    finder = hook.LmEvalFinder()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    import cru_fake_pkg.other  # noqa: F401  (not watched: no action)
    assert seen == []
    import cru_fake_pkg.watched  # noqa: F401
    assert seen == [42]  # ran once, after the module body
    assert cru_fake_pkg.watched.__spec__.loader.get_source("cru_fake_pkg.watched") == "VALUE = 41\n"
    for name in ("cru_fake_pkg", "cru_fake_pkg.watched", "cru_fake_pkg.other"):
        sys.modules.pop(name, None)


def test_finder_failure_is_reported_not_raised(tmp_path, monkeypatch, capsys):
    pkg = tmp_path / "cru_fake_pkg2"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    hook = _load_hook_copy()

    def boom():
        raise RuntimeError("simulated")

    monkeypatch.setattr(hook, "_ACTIONS", {"cru_fake_pkg2": boom})
    monkeypatch.setattr(sys, "meta_path", [hook.LmEvalFinder(), *sys.meta_path])
    import cru_fake_pkg2  # noqa: F401
    err = capsys.readouterr().err
    assert "simulated" in err and "cru-eval" in err
    sys.modules.pop("cru_fake_pkg2", None)


def test_install_respects_the_off_switch(monkeypatch):
    hook = _load_hook_copy()
    monkeypatch.setattr(hook, "_ACTIONS", {})  # nothing to act on: only the finder is at stake
    # without the finder the `.pth` hook already put there, which install() would otherwise leave alone
    without = [f for f in sys.meta_path if type(f).__name__ != "LmEvalFinder"]
    monkeypatch.setattr(sys, "meta_path", list(without))
    monkeypatch.setenv("CRU_HARNESS_NO_LMEVAL_HOOK", "1")
    hook.install()
    assert sys.meta_path == without
    monkeypatch.delenv("CRU_HARNESS_NO_LMEVAL_HOOK")
    hook.install()
    hook.install()   # once only
    assert [type(f).__name__ for f in sys.meta_path] == ["LmEvalFinder"] + [type(f).__name__ for f in without]


def test_register_is_idempotent_and_keeps_builtins():
    from lm_eval.api.registry import get_model, model_registry

    registration.register()
    registration.register()
    assert registration.is_registered()
    assert get_model("hf").__name__ == "HFLM"
    assert get_model("cru").__name__ == "CRULM"
    assert len([k for k in model_registry.keys() if k == "cru"]) == 1


def test_tasks_dir_holds_the_built_in_benchmarks_task_folders():
    tdir = Path(registration.tasks_dir())
    assert all((tdir / name / "tasks" / "_default_template_yaml").is_file() for name in ("tofu", "rwku", "muse"))


def test_task_manager_patch_adds_project_tasks_only_with_defaults():
    calls = []

    class FakeTaskManager:
        def __init__(self, verbosity=None, include_path=None, include_defaults=True, metadata=None):
            calls.append((include_path, include_defaults, metadata))

    registration.patch_task_manager(FakeTaskManager)
    registration.patch_task_manager(FakeTaskManager)  # idempotent: not wrapped twice
    ours = registration.tasks_dir()
    paths = registration.task_paths()   # the built-in benchmarks' folder, then the others' (none installed here)
    assert paths[0] == ours
    FakeTaskManager()
    FakeTaskManager(include_path="/x", metadata={"a": 1})
    FakeTaskManager(include_path=["/x", ours])
    FakeTaskManager(include_path=["/x", *paths])
    FakeTaskManager(include_path="/x", include_defaults=False)
    assert calls == [
        (paths, True, None),
        ([*paths, "/x"], True, {"a": 1}),  # user paths come later, so they win a name clash
        ([*paths[1:], "/x", ours], True, None),   # only the folders not given yet are added
        (["/x", *paths], True, None),
        ("/x", False, None),
    ]


def test_real_task_manager_is_patched_when_lm_eval_is_imported():
    from lm_eval.tasks import TaskManager

    assert getattr(TaskManager.__init__, "_cru_harness_patched", False), (
        "the .pth hook did not patch TaskManager: is cru_harness_lmeval.pth installed in site-packages?")


def test_a_late_install_reports_a_failing_action(monkeypatch, capsys):
    """Installed after lm-eval was imported, the hook acts at once; a failure is said on stderr (as on import),
    not swallowed."""
    hook = _load_hook_copy()

    def boom():
        raise RuntimeError("simulated late")

    monkeypatch.setattr(hook, "_ACTIONS", {"json": boom})   # a module that is surely imported already
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if type(f).__name__ != "LmEvalFinder"])
    monkeypatch.delenv("CRU_HARNESS_NO_LMEVAL_HOOK", raising=False)
    hook.install()
    err = capsys.readouterr().err
    assert "hook failed after importing json" in err and "simulated late" in err and "cru-eval" in err
