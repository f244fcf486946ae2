"""Shared fixtures. Tests that need the real benchmark files are marked `shared_data`.

Where ../shared/data is absent they skip with a reason, so a fresh clone's pytest passes; CI sets
CRU_HARNESS_REQUIRE_DATA=1, which turns that skip into a failure so CI always runs them.
"""
import importlib.util
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def _shared_data_dir() -> Path:
    return Path(os.environ.get("CRU_HARNESS_SHARED_DATA", DEFAULT_SHARED_DATA))


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
