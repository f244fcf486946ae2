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
from cru_harness.baselines.trainer import group_totals
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


def test_group_totals_live_on_the_accelerator_device():
    """The baselines' CUDA crash: the counts were combined with a tensor made on the CPU."""
    labels = torch.tensor([[IGNORE_INDEX, 5, 6, 7], [IGNORE_INDEX, IGNORE_INDEX, 8, IGNORE_INDEX]])
    group = [{"forget": {"labels": labels.to("meta")}}] * 2
    totals = group_totals(group, SimpleNamespace(device=torch.device("meta")))
    tokens, seqs = totals["forget"]
    assert tokens.device.type == "meta" and seqs.device.type == "meta"
    cpu = group_totals([{"forget": {"labels": labels}}] * 2, SimpleNamespace(device=torch.device("cpu")))
    assert cpu["forget"][0].item() == 8 and cpu["forget"][1].item() == 4


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
