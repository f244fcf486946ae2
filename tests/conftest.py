"""Shared fixtures. Tests that need the real benchmark files are marked `shared_data`.

Where ../shared/data is absent they skip with a reason, so a fresh clone's pytest passes; CI sets
CRU_HARNESS_REQUIRE_DATA=1, which turns that skip into a failure so CI always runs them. That covers the data the
shared folder provides (TOFU, RWKU). A benchmark it does not provide (MUSE: Hub-only) has its real-data tests run
where a copy is given (its environment variable, or its folder under the shared one) and skip otherwise, under
CRU_HARNESS_REQUIRE_DATA=1 too (`optional_data_dir`).
"""
import importlib.util
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def _shared_data_dir() -> Path:
    return Path(os.environ.get("CRU_HARNESS_SHARED_DATA", DEFAULT_SHARED_DATA))


#: The environment as the session started: a module's autouse fixture may clear a data variable for its own tests.
START_ENV = dict(os.environ)


def optional_data_dir(env_var: str, folder: str, what: str, hint: str = "", environ=None) -> Path:
    """A real copy of data the shared folder does not provide: `$env_var` (as the session started), else `folder`
    under the shared data folder. Neither: skip with the reason, whatever CRU_HARNESS_REQUIRE_DATA says (it demands
    TOFU and RWKU, which the shared folder provides). A variable naming no folder fails: a copy was given."""
    environ = START_ENV if environ is None else environ
    if value := environ.get(env_var):
        if not Path(value).is_dir():
            pytest.fail(f"{env_var}={value} is not a folder")
        return Path(value)
    shared = _shared_data_dir() / folder
    if shared.is_dir():
        return shared
    pytest.skip(f"no real {what} copy: set {env_var} or put one at {shared}{f' ({hint})' if hint else ''}; "
                "CRU_HARNESS_REQUIRE_DATA covers the shared folder's TOFU and RWKU only")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Root holding tofu/ and rwku/ (the real files)."""
    root = _shared_data_dir()
    if not (root / "tofu").is_dir() or not (root / "rwku").is_dir():
        reason = f"real TOFU/RWKU files not found at {root} (set CRU_HARNESS_SHARED_DATA)"
        if os.environ.get("CRU_HARNESS_REQUIRE_DATA") == "1":
            pytest.fail(reason + "; CRU_HARNESS_REQUIRE_DATA=1 demands them")
        pytest.skip(reason)
    return root


@pytest.fixture(scope="session")
def tofu_dir(shared_data: Path) -> Path:
    return shared_data / "tofu"


@pytest.fixture(scope="session")
def rwku_dir(shared_data: Path) -> Path:
    return shared_data / "rwku"


def _cuda_missing() -> str | None:
    """Why CUDA cannot be used here, or None when it can."""
    import torch

    if torch.version.cuda is None:
        return f"needs CUDA: this torch ({torch.__version__}) is a CPU build"
    if not torch.cuda.is_available():
        return "needs CUDA: no GPU is visible"
    return None


def pytest_runtest_setup(item):
    """`gpu` tests skip with a reason without CUDA; CRU_HARNESS_REQUIRE_GPU=1 (the GPU run) makes that a failure."""
    if item.get_closest_marker("gpu") is None:
        return
    reason = _cuda_missing()
    if reason is None:
        return
    if os.environ.get("CRU_HARNESS_REQUIRE_GPU") == "1":
        pytest.fail(reason + "; CRU_HARNESS_REQUIRE_GPU=1 demands it")
    pytest.skip(reason)


def load_benchmark(name: str):
    """A script of benchmarks/ as a module (they are scripts, not a package), e.g. load_benchmark("outlier_gates"),
    load_benchmark("cpu_campaign/land")."""
    spec = importlib.util.spec_from_file_location(name.replace("/", "."), REPO_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_config_cells(tmp_path: Path, config: dict) -> tuple[Path, list[dict]]:
    """`cru-harness run` on `config` (written as YAML under `tmp_path`), output in `tmp_path/run`: the run directory
    and every cell's result, each asserted finished ok."""
    import json

    import yaml

    from cru_harness.cli import main

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "run"
    assert main(["run", str(path), "--output-dir", str(out)]) == 0
    results = [json.loads(p.read_text()) for p in (out / "cells").glob("*/result.json")]
    assert all(r["status"] == "ok" for r in results), [r.get("error") for r in results]
    return out, results
