"""Issue 9, under lm-eval: the `cru` model refuses bad input before loading anything (misspelt argument, missing
or empty base path, a file given as `routers=`), with the project's own error types, and lm-eval's command
line prints those as one line while any other error keeps its traceback."""
from __future__ import annotations

import subprocess
import sys

import pytest

from test_lmeval_support import shared_tiny_dir

from cru_harness.cru.bundle import BundleConfig, BundleError, RouterBundle, base_fingerprint
from cru_harness.errors import UserError
from cru_harness.lmeval.errors import install_excepthook
from cru_harness.lmeval.model import CRULM, ModelArgumentError
from cru_harness.locations import ModelPathError


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return shared_tiny_dir(tmp_path_factory)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"router": "x"}, ModelArgumentError, "cru model: unknown argument 'router' in --model_args (did you mean "
                                          "'routers'?)"),
    ({"bsae": "x"}, ModelArgumentError, "unknown argument 'bsae'"),
    ({"dtpye": "float32"}, ModelArgumentError, "(did you mean 'dtype'?)"),
])
def test_misspelt_arguments_are_refused_before_loading(model_dir, kwargs, error, words, monkeypatch):
    def never(*args, **kw):
        raise AssertionError("the base model was loaded")

    monkeypatch.setattr("lm_eval.models.huggingface.HFLM.__init__", never)
    with pytest.raises(error) as info:
        CRULM(base=str(model_dir), device="cpu", **kwargs)
    assert words in str(info.value) and isinstance(info.value, UserError)


def test_an_argument_no_one_takes_is_named(model_dir):
    with pytest.raises(ModelArgumentError, match=r"cru model: unknown argument 'foo' in --model_args \(not an "
                                                  r"argument of cru, HFLM or the model: .*'foo'"):
        CRULM(base=str(model_dir), device="cpu", foo=1)


def test_base_paths_are_named(tmp_path, monkeypatch):
    monkeypatch.setattr("lm_eval.models.huggingface.HFLM.__init__", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(ModelPathError, match=f"base model {tmp_path / 'missing'} does not exist"):
        CRULM(base=str(tmp_path / "missing"), device="cpu")
    with pytest.raises(ModelPathError, match=f"base model directory {tmp_path} holds no config.json"):
        CRULM(base=str(tmp_path), device="cpu")
    (tmp_path / "weights.bin").write_text("x")
    with pytest.raises(ModelPathError, match="is a file, not a model directory"):
        CRULM(base=str(tmp_path / "weights.bin"), device="cpu")


def test_routers_pointing_at_a_file_says_it_is_not_a_bundle_directory(model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr("lm_eval.models.huggingface.HFLM.__init__", lambda *a, **k: pytest.fail("loaded"))
    weights = tmp_path / "routers.safetensors"
    weights.write_bytes(b"x")
    with pytest.raises(BundleError, match=f"{weights} is a file, not a router bundle directory"):
        CRULM(base=str(model_dir), routers=str(weights), device="cpu")


def test_valid_arguments_still_load(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    blocks = [base_fingerprint(model)["num_layers"] - 1]
    config = BundleConfig(base_model=str(model_dir), fingerprint=base_fingerprint(model), block_indices=blocks,
                          neurons={blocks[0]: [0, 1]}, d_r=2, percentile=95.0, lam=1.0, seed=0)
    bundle = RouterBundle(config).save_pretrained(tmp_path / "b")
    lm = CRULM(base=str(model_dir), routers=str(bundle), device="cpu", batch_size=1, dtype="float32",
               low_cpu_mem_usage=True)  # a from_pretrained argument passes through
    assert lm.has_routers


def test_excepthook_prints_project_errors_as_one_line_and_keeps_other_tracebacks(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *exc: seen.append(exc[0]))
    monkeypatch.setattr(sys, "argv", ["lm_eval"])
    install_excepthook()
    hook = sys.excepthook
    install_excepthook()  # once only: not wrapped twice
    assert sys.excepthook is hook
    sys.excepthook(BundleError, BundleError("bad bundle\nsecond line"), None)
    assert capsys.readouterr().err == "lm_eval: error: bad bundle second line\n" and seen == []
    sys.excepthook(KeyError, KeyError("bug"), None)
    assert seen == [KeyError]


@pytest.mark.slow
def test_lm_eval_command_line_prints_one_line(model_dir, tmp_path):
    """The real `python -m lm_eval` (the .pth hook installs the reporting): one line, non-zero exit."""
    (tmp_path / "file").write_text("x")
    env_cmd = [sys.executable, "-m", "lm_eval", "--model", "cru", "--tasks", "tofu_forget01", "--device", "cpu",
               "--model_args"]
    proc = subprocess.run(env_cmd + [f"base={model_dir},routers={tmp_path / 'file'}"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"lm_eval: error: {tmp_path / 'file'} is a file, not a router bundle directory (a directory holding "
        "cru_bundle.json and routers.safetensors)")
    assert "Traceback" not in proc.stderr
