"""benchmarks/bench_scale.py on the CPU: the small shape trains full and LoRA through the engine, each in its own
process, and records peak memory and step time; FSDP records why it cannot run here."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_scale_smoke_run_records_each_mode(tmp_path):
    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_scale.py"), "--shape", "tiny",
                           "--device", "cpu", "--modes", "full,lora,fsdp", "--steps", "2", "--batch", "4",
                           "--micro-batch", "2", "--seq-len", "16", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = {r["mode"]: r for r in json.loads(out.read_text())}
    assert set(records) == {"full", "lora", "fsdp"}
    full, lora = records["full"], records["lora"]
    for record in (full, lora):
        assert "error" not in record, record
        assert record["steps"] == 2 and record["processes"] == 1 and record["peak_gib"] > 0
        assert record["s_per_step"] > 0
    # LoRA trains a small adapter of the same base; full trains every weight
    assert full["trainable_parameters"] == full["parameters"]
    assert 0 < lora["trainable_parameters"] < full["parameters"] / 10
    assert "needs GPUs" in records["fsdp"]["skipped"]
