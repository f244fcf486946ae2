"""Shared helpers of the lm-eval integration tests: a tiny local model, router bundles, the test task dir."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
TASKS_DIR = TESTS_DIR / "lmeval_tasks"

CORPUS = [
    "Question: What colour is the sky?\nAnswer: blue",
    "Question: How many legs has a cat?\nAnswer: four",
    "Question: Where do fish live?\nAnswer: in water",
    "Question: What do bees make?\nAnswer: honey",
    "The sky is blue and the grass is green. A cat has four legs and a long tail.",
    "Fish live in water, birds fly in the sky. Bees make honey from the nectar of flowers.",
    "two six red green milk bread trees",
] * 4


def build_tiny_dir(out_dir: Path, *, chat_template: bool = False, arch: str = "llama", seed: int = 0) -> Path:
    """A tiny, randomly initialised causal LM saved with its tokenizer (built once per directory)."""
    if (out_dir / "config.json").exists():
        return out_dir
    from cru_harness.testbed.models import build_tiny_model, save_tiny_model
    from cru_harness.testbed.tokenizer import train_tokenizer

    tok = train_tokenizer(CORPUS, vocab_size=300, chat_template=chat_template)
    model = build_tiny_model(arch, tok, seed=seed, n_layers=8, hidden_size=32)
    return save_tiny_model(model, tok, out_dir)


def shared_tiny_dir(tmp_path_factory, name: str = "tiny_llama", **kwargs) -> Path:
    root = tmp_path_factory.getbasetemp() / "lmeval_models"
    root.mkdir(exist_ok=True)
    return build_tiny_dir(root / name, **kwargs)


def run(cmd: list[str], *, cwd: Path, timeout: int = 300, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update({"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": "1"})
    env.pop("CRU_HARNESS_NO_LMEVAL_HOOK", None)
    env.update(env_extra or {})
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n"
                             f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}")
    return proc


def console_script(name: str) -> str:
    """The console script installed next to this interpreter (fails clearly when it is not installed)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.fail(f"console script {name!r} not found beside {sys.executable}; is cru-harness installed?")
    return str(path)


def test_tiny_model_dir_builds(tmp_path_factory):
    d = shared_tiny_dir(tmp_path_factory)
    assert (d / "config.json").exists() and (d / "tokenizer.json").exists()
