"""`cru_harness.devices` (one place for devices and dtypes) and the CPU checks that catch device mistakes.

The `meta` device stands in for a GPU: a tensor created on the CPU and combined with one on `meta` fails the
way a CPU tensor combined with a CUDA one does, so device mistakes show on a machine without a GPU.
"""
from types import SimpleNamespace

import pytest
import torch

from cru_harness import devices
from cru_harness.baselines.data import IGNORE_INDEX
from cru_harness.baselines.losses import sequence_mean, token_mean
from cru_harness.training.engine import group_totals
from cru_harness.cli import main


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "cpu:0", "cuda0", "tpu", ""])
def test_bad_device_strings_name_the_problem(spec):
    with pytest.raises(devices.DeviceError, match="is not one of auto, cpu, cuda, cuda:N"):
        devices.resolve_device(spec)


def test_auto_and_cpu_resolve():
    assert devices.resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert devices.resolve_device("auto").type == expected
    assert devices.resolve_device(None).type == expected
    # the device accelerate gives each process of a multi-process CPU run
    assert devices.resolve_device(torch.device("cpu", 0)) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a machine without CUDA")
def test_missing_cuda_is_one_clear_error():
    with pytest.raises(devices.DeviceError, match=r"device 'cuda:1': .*(no CUDA|not visible|no CUDA GPU)"):
        devices.resolve_device("cuda:1")


def test_device_index_out_of_range(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(devices.DeviceError, match=r"only 2 CUDA device\(s\) visible"):
        devices.resolve_device("cuda:2")
    assert devices.resolve_device("cuda:1") == torch.device("cuda", 1)


def test_dtypes():
    assert devices.parse_dtype("bf16") is torch.bfloat16 and devices.parse_dtype("float32") is torch.float32
    assert devices.parse_dtype("auto") == "auto" and devices.parse_dtype(None) == "auto"
    assert devices.parse_dtype(torch.float16) is torch.float16
    with pytest.raises(devices.DeviceError, match="dtype 'int8' is not one of"):
        devices.parse_dtype("int8")
    assert devices.training_precision("float32") == (torch.float32, "no")
    # fp32 master weights under autocast: AdamW on bf16 / fp16 weights loses most updates
    assert devices.training_precision("bfloat16") == (torch.float32, "bf16")
    assert devices.training_precision("float16") == (torch.float32, "fp16")
    assert devices.saved_dtype("bf16") is torch.bfloat16 and devices.saved_dtype("auto") is torch.float32


def test_bf16_on_a_gpu_without_it_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100")
    with pytest.raises(devices.DeviceError, match="Tesla V100 has no bf16 support"):
        devices.check_dtype_on_device(torch.bfloat16, torch.device("cuda", 0))
    devices.check_dtype_on_device(torch.bfloat16, torch.device("cpu"))  # CPU runs bf16


def test_device_map():
    assert devices.check_device_map(None) is None and devices.check_device_map("auto") == "auto"
    assert devices.check_device_map({"": "cpu"}) == {"": "cpu"}
    with pytest.raises(devices.DeviceError, match="only 'auto'"):
        devices.check_device_map("balanced_low_0")


def test_a_model_for_one_gpu_is_loaded_straight_onto_it(monkeypatch):
    """No device_map and a CUDA device: transformers gets a one-device map, so each tensor goes to the GPU as it is
    read (loading on the CPU first held the whole fp32 model in host memory, once per launched process)."""
    import transformers

    class Stop(Exception):
        pass

    seen = []

    def from_pretrained(path, **kwargs):
        seen.append(kwargs.get("device_map"))
        raise Stop

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(devices, "resolve_device", lambda spec: torch.device(spec))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    for spec in ("cuda:1", "cuda", "cpu"):
        with pytest.raises(Stop):
            devices.load_causal_lm("some/model", device=spec, dtype="float32")
    with pytest.raises(Stop):
        devices.load_causal_lm("some/model", device="cuda:1", device_map={"model": 0, "lm_head": 1})
    assert seen == [{"": "cuda:1"}, {"": "cuda:3"}, None, {"model": 0, "lm_head": 1}]


def test_only_a_map_over_several_devices_is_sharded():
    """transformers 4 records a one-device map in `hf_device_map`; such a model is moved whole like any other."""
    model = torch.nn.Linear(2, 2)
    assert not devices.is_sharded(model)
    model.hf_device_map = {"": 0}
    assert not devices.is_sharded(model)
    model.hf_device_map = {"model.layers.0": 0, "model.layers.1": 0}
    assert not devices.is_sharded(model)
    model.hf_device_map = {"model.layers.0": 0, "lm_head": 1}
    assert devices.is_sharded(model)


def test_a_sharded_models_resources_measure_each_of_its_gpus():
    """A device_map over several GPUs: the training's peak memory is read on each of them (it was the current
    GPU's alone); a one-device map or none measures the device given."""
    from cru_harness.training.resources import ResourceMonitor, sharded_gpus

    model = torch.nn.Linear(2, 2)
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": "cuda:1", "model.layers.1": 3,
                           "lm_head": "cpu"}
    assert sharded_gpus(model) == [torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cuda", 3)]
    assert ResourceMonitor("cuda:0", model=model).gpus == sharded_gpus(model)
    model.hf_device_map = {"": 0}
    assert sharded_gpus(model) == [] and ResourceMonitor("cuda:2", model=model).gpus == [torch.device("cuda", 2)]
    assert ResourceMonitor("cpu", model=model).gpus == []


def test_group_totals_live_on_the_accelerator_device():
    """The baselines' CUDA crash: the counts were combined with a tensor made on the CPU."""
    labels = torch.tensor([[IGNORE_INDEX, 5, 6, 7], [IGNORE_INDEX, IGNORE_INDEX, 8, IGNORE_INDEX]])
    attention = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    group = [{"forget": {"labels": labels.to("meta"), "attention_mask": attention.to("meta")}}] * 2
    totals = group_totals(group, SimpleNamespace(device=torch.device("meta")))
    assert {count.device.type for count in totals["forget"].values()} == {"meta"}
    cpu = group_totals([{"forget": {"labels": labels, "attention_mask": attention}}] * 2,
                       SimpleNamespace(device=torch.device("cpu")))
    assert {name: count.item() for name, count in cpu["forget"].items()} == {"tokens": 8, "seqs": 4, "positions": 14}


def test_reductions_follow_the_values_device():
    """Under a device_map the loss lives on the last GPU, the group totals on the first."""
    values = torch.ones(3, device="meta")
    inputs = {"group_tokens": torch.tensor(6.0), "group_seqs": torch.tensor(3.0)}
    assert token_mean(values, values, inputs).device.type == "meta"
    assert sequence_mean(values, inputs).device.type == "meta"


def test_cli_rejects_a_bad_device_in_one_line(capsys, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "q", "answer": "a"}\n')
    code = main(["finetune", "--model", "org/never-loaded", "--data", str(rows), "--out", str(tmp_path / "o"),
                 "--device", "gpu0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "device 'gpu0' is not one of" in err[0]
