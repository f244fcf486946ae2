"""benchmarks/bench_gpu_cost.py end to end in its CPU smoke mode: every method in its own process, records with
the issue's fields, CRU's time split into its phases."""
import json
import subprocess
import sys

import pytest

from conftest import REPO_ROOT


@pytest.mark.slow
@pytest.mark.shared_data
def test_gpu_cost_bench_smoke_on_cpu(tofu_dir, tmp_path):
    out = tmp_path / "gpu_cost.json"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_gpu_cost.py"), "--shape", "tiny",
                           "--device", "cpu", "--dtypes", "float32", "--rows", "8", "--epochs", "1", "--threads",
                           "1", "--data-dir", str(tofu_dir), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = json.loads(out.read_text())
    assert [r["method"] for r in records] == ["CRU", "GD", "NPO"]
    for record in records:
        assert {"gpu", "shape", "dtype", "method", "peak_gib", "weights_gib", "s_per_row_epoch", "steps"} <= set(record)
        assert record["gpu"] == "cpu" and record["shape"] == "tiny" and record["dtype"] == "float32"
        assert record["forget_rows"] == 8 and record["epochs"] == 1 and record["steps"] >= 1
        assert record["s_per_row_epoch"] == pytest.approx(record["wall_s"] / 8)
        assert record["peak_gib"] > record["weights_gib"] > 0
    cru = records[0]
    assert set(cru["cru_time_s"]) == {"localization_s", "prefix_s", "steps_s", "final_gates_s"}
    assert sum(cru["cru_time_s"].values()) <= cru["wall_s"]
    assert cru["cru_prefix_cache"]["prefix_cache"] is True and cru["cru_prefix_cache"]["prefix_rows"] >= 8
    assert "CRU / GD time per forget row and epoch" in proc.stdout
