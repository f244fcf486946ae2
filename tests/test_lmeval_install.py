"""A built wheel puts the `.pth` hook into site-packages and the routes work from that install alone.

Builds the wheel from a copy of the source tree (no build isolation: offline), installs it with `--no-deps`
into a throwaway venv that sees the test run's own site-packages (torch, lm-eval), and checks in that venv that
the hook, the `cru` model and the packaged tasks all come from the wheel, not from the development checkout.

The throwaway venv does not use `--system-site-packages`: when the test runs inside a venv (the usual install),
that flag would show it the *base* interpreter's packages, not the venv's. Instead it lists the running
interpreter's site-packages directories in a `.pth` file: plain path lines, so the `.pth` files in those
directories (the development checkout's editable-install hook among them) are not run there.
"""
from __future__ import annotations

import shutil
import sys
import importlib.util
import textwrap
import zipfile
from pathlib import Path

import pytest

from test_lmeval_support import run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "cru_harness", src / "cru_harness", ignore=ignore)
    shutil.copytree(REPO / "configs", src / "configs", ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        cwd=src)
    (whl,) = out.glob("cru_harness-*.whl")
    return whl


def test_wheel_has_pth_at_root_and_tasks(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "cru_harness_lmeval.pth" in names  # root of purelib = site-packages
    assert "cru_harness/lmeval/_hook.py" in names
    assert any(n.startswith("cru_harness/benchmarks/tofu/tasks/") and n.endswith(".yaml") for n in names)
    # templates named *_yaml (not .yaml) and the demo config must ship too, or a wheel install breaks
    assert {"cru_harness/benchmarks/tofu/tasks/_forget_template_yaml", "cru_harness/benchmarks/rwku/tasks/rwku.yaml",
            "cru_harness/configs/demo.yaml"} <= set(names)
    record = next(n for n in names if n.endswith(".dist-info/RECORD"))
    assert "cru_harness_lmeval.pth," in zipfile.ZipFile(wheel).read(record).decode()  # pip uninstall removes it
    # every module of the checkout's package ships (pyproject lists the packages by hand), and every config
    modules = {f"cru_harness/{p.relative_to(REPO / 'cru_harness').as_posix()}"
               for p in (REPO / "cru_harness").rglob("*.py") if "__pycache__" not in p.parts}
    configs = {f"cru_harness/configs/{p.relative_to(REPO / 'configs').as_posix()}"
               for p in (REPO / "configs").rglob("*.yaml")}
    assert "cru_harness/studies/cli.py" in modules and "cru_harness/configs/studies/lambda.yaml" in configs
    assert not (modules | configs) - set(names), sorted((modules | configs) - set(names))


def outer_site_dirs() -> list[str]:
    """The site-packages directories this test run imports from (a venv's, and its base's if it includes them)."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


def test_wheel_install_in_venv_registers_model_and_tasks(wheel, tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    py = venv / "bin" / "python"
    purelib = run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                  cwd=tmp_path).stdout.strip()
    # After the venv's own site-packages (where the wheel goes), so the wheel's cru_harness wins.
    (Path(purelib) / "outer_site_packages.pth").write_text("\n".join(outer_site_dirs()) + "\n")
    outer_lm_eval = Path(importlib.util.find_spec("lm_eval").origin).resolve()
    run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)], cwd=tmp_path)
    code = textwrap.dedent(f"""
        import sys, sysconfig, inspect
        from pathlib import Path
        venv = Path({str(venv)!r}).resolve()
        site = Path(sysconfig.get_paths()["purelib"]).resolve()
        assert venv in site.parents, site
        assert (site / "cru_harness_lmeval.pth").exists()
        hook = sys.modules["_cru_harness_lmeval_hook"]
        assert Path(hook.__file__).resolve().is_relative_to(site), hook.__file__
        import lm_eval
        assert Path(lm_eval.__file__).resolve() == Path({str(outer_lm_eval)!r}), \
            lm_eval.__file__  # the test run's lm-eval, not another one
        from lm_eval.api.registry import get_model
        assert get_model("hf").__name__ == "HFLM"
        cls = get_model("cru")
        assert Path(inspect.getfile(cls)).resolve().is_relative_to(site), inspect.getfile(cls)
        from cru_harness.lmeval.registration import tasks_dir
        tdir = Path(tasks_dir())
        assert tdir.is_relative_to(site) and (tdir / "tofu" / "tasks" / "tofu_forget10.yaml").exists(), tdir
        from lm_eval.tasks import TaskManager
        tm = TaskManager()
        missing = [n for n in ("tofu_forget10", "rwku_aa", "hellaswag") if n not in tm.all_tasks]
        assert not missing, (missing, tm.include_path)
        assert Path(tm.task_index["tofu_forget10"].yaml_path).resolve().is_relative_to(site)
        from cru_harness.runner import provenance
        assert Path(provenance.__file__).resolve().is_relative_to(site)
        print("code-version", provenance.code_version())
        print("wheel-ok")
    """)
    proc = run([str(py), "-c", code], cwd=tmp_path)
    assert "wheel-ok" in proc.stdout
    # the same source gives the same code version from the wheel as from this checkout: cells computed from one
    # (a user's wheel install, a checkout's runs) are not stale for the other
    from cru_harness.runner.provenance import code_version

    assert f"code-version {code_version()}" in proc.stdout
    # the command line from that install alone: every subcommand registers (one missing package broke them all)
    usage = run([str(venv / "bin" / "cru-harness"), "--help"], cwd=tmp_path).stdout
    assert all(sub in usage for sub in ("unlearn", "finetune", "score", "report", "run", "demo", "study")), usage
    # the README's commands name shipped configs as configs/...: from that install, outside any checkout, they
    # resolve to the configs the wheel ships
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    plan = run([str(venv / "bin" / "cru-harness"), "run", "configs/ci_minimal.yaml", "--dry-run",
                "--output-dir", str(outside / "run")], cwd=outside).stdout
    assert "ci_minimal" in plan
    demo = run([str(venv / "bin" / "cru-harness"), "demo", "--dry-run"], cwd=outside).stdout
    assert "no committed results at results/demo (a wheel install has none)" in demo
    # a source tree without configs/ first on sys.path (the checkout's root as cwd, beside a regular install)
    # still starts: nothing looks the shipped configs up at import time
    shadow = tmp_path / "shadow"
    shutil.copytree(REPO / "cru_harness", shadow / "cru_harness", ignore=shutil.ignore_patterns("__pycache__"))
    usage = run([str(py), "-m", "cru_harness", "--help"], cwd=shadow).stdout
    assert "demo" in usage
