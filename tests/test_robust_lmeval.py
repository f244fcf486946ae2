"""Issue 9, under lm-eval: the `cru` model refuses bad input before loading anything (misspelt argument, missing
or empty base path, a file given as `routers=`, a dtype, `max_length` or device that cannot be used), a base
that cannot be read and a misspelt `--metadata` key of the tasks are named, with the project's own error types,
and lm-eval's command line prints those as one line while any other error keeps its traceback."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from test_lmeval_support import shared_tiny_dir

from cru_harness.cru.bundle import BundleConfig, BundleError, RouterBundle, base_fingerprint
from cru_harness.devices import DeviceError
from cru_harness.errors import InputError, UserError
from cru_harness.lmeval.errors import install_excepthook
from cru_harness.lmeval.metadata import METADATA_KEYS, SUITE_PREFIXES, check_metadata_keys
from cru_harness.lmeval.model import (CRULM, FROM_PRETRAINED_KWARGS, ModelArgumentError, check_argument_values,
                                      known_arguments)
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


@pytest.mark.parametrize("kwargs, error, words", [
    ({"dtype": "float17"}, DeviceError, "dtype='float17' in --model_args is not a torch floating dtype (e.g. auto, "
                                        "float32, bfloat16, float16)"),
    ({"softmax_dtype": "float17"}, DeviceError, "softmax_dtype='float17' in --model_args is not a torch floating "
                                                "dtype (e.g. float32,"),
    ({"softmax_dtype": "int64"}, DeviceError, "softmax_dtype='int64' in --model_args is not a torch floating dtype"),
    ({"mixed_precision_dtype": "auto"}, DeviceError, "mixed_precision_dtype='auto' in --model_args is not a torch"),
    ({"device": 0}, DeviceError, "device 0 is not one of"),   # not a device name: refused, not read as none
    ({"max_length": "abc"}, ModelArgumentError, "max_length='abc' in --model_args is not a positive integer"),
    ({"max_length": 0}, ModelArgumentError, "max_length=0 in --model_args is not a positive integer"),
    ({"device": "cuda:99"}, DeviceError, "device 'cuda:99': "),
    ({"device": "tpu"}, DeviceError, "device 'tpu' is not one of auto, cpu, cuda, cuda:N"),
])
def test_unusable_values_are_refused_before_loading(model_dir, kwargs, error, words, monkeypatch):
    monkeypatch.setattr("lm_eval.models.huggingface.HFLM.__init__", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(error) as info:
        CRULM(base=str(model_dir), **{"device": "cpu", **kwargs})
    assert words in str(info.value) and isinstance(info.value, UserError)


def test_usable_values_reach_lm_eval_in_its_spelling():
    import torch

    kwargs = {"dtype": "bf16", "softmax_dtype": "torch.float32", "max_length": "128", "device": "auto"}
    check_argument_values(kwargs)
    assert kwargs == {"dtype": "bfloat16", "softmax_dtype": "float32", "max_length": 128,
                      "device": "cuda" if torch.cuda.is_available() else "cpu"}
    wide = {"softmax_dtype": "float64", "dtype": "torch.float64", "device": "cpu"}   # lm-eval takes these too
    check_argument_values(wide)
    assert wide == {"softmax_dtype": "float64", "dtype": "float64", "device": "cpu"}
    default = {"device": "cuda:0"}  # lm_eval's command line without --device: HFLM's CPU fallback is kept
    check_argument_values(default)
    assert default == {"device": "cuda:0" if torch.cuda.is_available() else "cpu"}
    unset = {}   # simple_evaluate(model="cru") without device=: where `auto` runs, not HFLM's `cuda`
    check_argument_values(unset)
    assert unset == {"device": "cuda" if torch.cuda.is_available() else "cpu"}


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


def _load_tasks(tasks, metadata):
    from lm_eval.tasks import TaskManager

    from cru_harness.lmeval.registration import tasks_dir

    return TaskManager(include_path=tasks_dir(), include_defaults=False, metadata=metadata).load(tasks)


@pytest.mark.parametrize("tasks, key, close", [
    (["rwku_fb"], "rwku_target", "rwku_targets"),
    (["tofu_forget01"], "tofu_prest", "tofu_preset"),
    (["tofu_forget01"], "rwku_item_per_target", "rwku_items_per_target"),  # either suite's key, in either suite
])
def test_a_misspelt_metadata_key_is_refused_not_ignored(tmp_path, tasks, key, close):
    # refused before any data is read: the data directory is empty
    with pytest.raises(InputError) as info:
        _load_tasks(tasks, {"data_dir": str(tmp_path), key: "5", "version": 1.0, "base": "m", "dtype": "auto"})
    message = str(info.value)
    assert message.startswith(f"unknown --metadata key {key!r} (did you mean {close!r}?); the benchmarks' tasks "
                              "read data_dir, tofu_preset, tofu_model_family,")   # each plugin's `metadata_keys`
    assert ", rwku_targets," in message and "tofu_author" in message
    assert "\n" not in message


@pytest.mark.parametrize("key, message", [
    ("tofu_prest", "unknown --metadata key 'tofu_prest' (did you mean 'tofu_preset'?)"),
    ("tofu_config", "--metadata key 'tofu_config' is not a setting: the TOFU task chooses the split"),
    ("rwku_probe", "--metadata key 'rwku_probe' is not a setting: the RWKU task chooses the probe"),
])
def test_the_task_manager_refuses_a_bad_metadata_key_when_it_is_built(key, message):
    """lm-eval's command line builds the TaskManager before loading the model, so the check runs there, not
    first in a task's loader after the load (and a YAML-set key no longer reaches lm-eval's own crash)."""
    from lm_eval.tasks import TaskManager

    from cru_harness.lmeval.registration import tasks_dir

    with pytest.raises(InputError) as info:
        TaskManager(metadata={"data_dir": "/nowhere", key: "x"})
    assert str(info.value).startswith(message)
    TaskManager(include_path=tasks_dir(), include_defaults=False, metadata={"rwku_targets": "1", "base": "m"})


def test_metadata_keys_of_both_suites_and_other_tools_pass():
    check_metadata_keys({key: "x" for key in METADATA_KEYS} | {"version": 1.0, "base": "m", "routers": "r",
                                                                 "pretrained": "m", "other_tool_key": 1})
    with pytest.raises(InputError, match=r"^unknown --metadata key 'tofu_zzz'; the benchmarks' tasks read"):  # no close match
        check_metadata_keys({"tofu_zzz": 1})
    # model arguments land in the tasks' metadata too: none may look like a suite's key
    import inspect

    from transformers import PreTrainedModel

    arguments = (known_arguments() | FROM_PRETRAINED_KWARGS
                 | set(inspect.signature(PreTrainedModel.from_pretrained).parameters))
    assert not [name for name in arguments if name.startswith(SUITE_PREFIXES)]
    # and every setting the runner passes the tasks is one they read (else its own runs would be refused)
    from cru_harness.runner.evaluation import PRESET_KEYS

    assert set(PRESET_KEYS) <= set(METADATA_KEYS)


def test_metadata_values_are_read_as_meant_or_refused():
    from cru_harness.lmeval.metadata import metadata_count, metadata_flag

    assert [metadata_flag(v, "k") for v in (True, "true", "Yes", 1, "1")] == [True] * 5
    assert [metadata_flag(v, "k") for v in (False, None, "false", "0", 0, "")] == [False] * 6   # "false" is false
    assert [metadata_count(v, "k") for v in (None, "", 0, "0", 5, "12")] == [None, None, None, None, 5, 12]
    for bad, call in (("maybe", metadata_flag), (-1, metadata_count), ("abc", metadata_count), (2.5, metadata_count),
                      (True, metadata_count)):
        with pytest.raises(InputError, match="^--metadata k="):
            call(bad, "k")


@pytest.mark.slow
@pytest.mark.parametrize("model_args, extra, last_line", [
    ("base={model},routers={file}", [], "{file} is a file, not a router bundle directory (a directory holding "
                                        "cru_bundle.json and routers.safetensors)"),
    ("base={model},softmax_dtype=float17", [], "cru model: softmax_dtype='float17' in --model_args is not a torch "
                                               "floating dtype (e.g. float32, bfloat16, float16)"),
    ("base={model}", ["--device", "cuda:99"], "device 'cuda:99': "),
    ("base=no-such-org/no-such-model", [], "cannot load base model 'no-such-org/no-such-model': "),
    # metadata is checked before the model loads: a base that does not exist is never reached
    ("base=no-such-org/no-such-model", ["--metadata", '{{"data_dir": "{data}", "rwku_target": "5"}}'],
     "unknown --metadata key 'rwku_target' (did you mean 'rwku_targets'?); "),
    ("base=no-such-org/no-such-model", ["--metadata", '{{"rwku_probe": "qa"}}'],
     "--metadata key 'rwku_probe' is not a setting: the RWKU task chooses the probe (rwku_fb, "),
])
def test_lm_eval_command_line_prints_one_line(model_dir, tmp_path, model_args, extra, last_line):
    """The real `python -m lm_eval` (the .pth hook installs the reporting): one line, non-zero exit."""
    (tmp_path / "file").write_text("x")
    names = {"model": model_dir, "file": tmp_path / "file", "data": tmp_path}
    cmd = [sys.executable, "-m", "lm_eval", "--model", "cru", "--tasks", "tofu_forget01,rwku_fb", "--device", "cpu",
           "--model_args", model_args.format(**names)] + [arg.format(**names) for arg in extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("lm_eval: error: " + last_line.format(**names))
    assert "Traceback" not in proc.stderr
