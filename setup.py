"""Only here to put `cru_harness_lmeval.pth` at the root of site-packages; all metadata is in pyproject.toml.

lm-eval 0.4.13 has no plugin discovery, so `lm_eval --model cru ...` works through a start-up `.pth` hook
(see cru_harness/lmeval/_hook.py). A `.pth` must sit directly in site-packages, which package data cannot do:

- regular wheel (`pip install .`, `python -m build`): `build_py` copies the file to the root of build_lib,
  which is the root of the wheel's purelib, i.e. site-packages;
- editable install (`pip install -e .`, PEP 660): setuptools builds an "editable wheel" from an unpacked
  directory; `editable_wheel` drops the file into that directory's root next to setuptools' own
  `__editable__.*.pth` (which sorts first, so the package is importable when ours runs).
"""
from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.editable_wheel import editable_wheel as _editable_wheel

PTH_NAME = "cru_harness_lmeval.pth"

# What the .pth runs at interpreter start: find `cru_harness` *without importing it*, load
# cru_harness/lmeval/_hook.py by path (stdlib only) and install its sys.meta_path finder. Any failure prints one
# line and leaves Python and lm-eval untouched. CRU_HARNESS_NO_LMEVAL_HOOK=1 switches it off.
_HOOK_CODE = """\
try:
    import os
    if not os.environ.get("CRU_HARNESS_NO_LMEVAL_HOOK"):
        import importlib.util as _u
        _s = _u.find_spec("cru_harness")
        if _s is not None and _s.submodule_search_locations:
            _p = os.path.join(list(_s.submodule_search_locations)[0], "lmeval", "_hook.py")
            _hs = _u.spec_from_file_location("_cru_harness_lmeval_hook", _p)
            _m = _u.module_from_spec(_hs)
            sys.modules["_cru_harness_lmeval_hook"] = _m
            _hs.loader.exec_module(_m)
            _m.install()
except Exception as _e:
    sys.stderr.write("cru-harness: lm-eval start-up hook not installed (%r); use cru-eval\\n" % (_e,))
"""
# site.py executes a .pth line only if it starts with "import"; the whole hook is one such line.
PTH_LINE = "import sys; exec(" + repr(_HOOK_CODE) + ")\n"


def _write_pth(directory) -> Path:
    target = Path(directory, PTH_NAME)
    target.write_text(PTH_LINE, encoding="utf-8")
    return target


class build_py(_build_py):
    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            _write_pth(self.build_lib)

    def get_outputs(self, include_bytecode=True):
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            outputs.append(str(Path(self.build_lib, PTH_NAME)))
        return outputs


if hasattr(_editable_wheel, "_run_build_commands"):
    class editable_wheel(_editable_wheel):
        def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):
            result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
            _write_pth(unpacked_wheel)
            return result
else:  # pragma: no cover - guards a setuptools change; a regular (non-editable) build is unaffected
    class editable_wheel(_editable_wheel):
        def run(self):
            raise RuntimeError(
                "this setuptools has no editable_wheel._run_build_commands; setup.py cannot place "
                f"{PTH_NAME} for editable installs. Install a setuptools within the tested range (77-84), or "
                "install without -e.")

setup(cmdclass={"build_py": build_py, "editable_wheel": editable_wheel})
