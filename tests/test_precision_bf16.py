"""`precision: bf16` (issue 77): bf16 weights, gradients and AdamW state stepped directly, no fp32 master copy, as
WMDP's RMU (rmu/utils.py loads the checkpoint's bf16, rmu/unlearn.py steps it) and open-unlearning's bf16 runs
train; beside the default fp32 master weights under the run's autocast. On the CPU with a tiny model."""
from __future__ import annotations

import warnings

import pytest
import torch

import cru_harness.baselines as B
from cru_harness.errors import InputError
from cru_harness.training import engine
from test_baselines_training import FORGET, RETAIN, base_dir, fast_config, tiny, tokenizer  # noqa: F401 (fixtures)


@pytest.fixture
def stepped(monkeypatch):
    """The dtypes of the trainable weights and of AdamW's moments after each optimizer step."""
    seen = []
    step = engine.Engine.step

    def spy(self, group, loss_fn):
        logs = step(self, group, loss_fn)
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        moments = [self.optimizer.state[p]["exp_avg"] for p in params if p in self.optimizer.state]
        seen.append(({p.dtype for p in params}, {m.dtype for m in moments}))
        return logs

    monkeypatch.setattr(engine.Engine, "step", spy)
    return seen


@pytest.mark.parametrize("precision, dtype, weights, mixed", [
    ("bf16", "float32", torch.bfloat16, "no"),           # bf16 whatever the run's dtype, no autocast
    ("fp32_master", "bfloat16", torch.float32, "bf16"),  # the default: fp32 master weights under bf16 autocast
])
def test_precision_decides_the_weights_and_adamw_state_stepped(base_dir, stepped, precision, dtype, weights, mixed):
    cfg = fast_config("ga", num_epochs=1, precision=precision)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)   # bf16 asked for: no "AdamW drops updates" warning
        res = B.unlearn(str(base_dir), None, FORGET, RETAIN, "ga", cfg, device="cpu", dtype=dtype, progress=False)
    assert stepped and all(s == ({weights}, {weights}) for s in stepped)
    assert (res.config["precision"], res.config["mixed_precision"]) == (precision, mixed)   # recorded as trained


def test_bf16_precision_is_checked(tokenizer, base_dir):
    with pytest.raises(InputError, match="precision 'fp8'"):
        fast_config("ga", precision="fp8")
    with pytest.raises(InputError, match="leave mixed_precision 'no'"):
        fast_config("ga", precision="bf16", mixed_precision="bf16")
    with pytest.raises(InputError, match="trainable weights are float32"):   # a model object is not cast
        B.unlearn(tiny(tokenizer), tokenizer, FORGET, RETAIN, "ga", fast_config("ga", precision="bf16"),
                  device="cpu", progress=False)
    with pytest.raises(InputError, match="LoRA"):
        B.unlearn(str(base_dir), None, FORGET, RETAIN, "ga", fast_config("ga", precision="bf16"), device="cpu",
                  progress=False, lora={"r": 2})


def test_a_method_entry_sets_precision(tmp_path):
    from cru_harness.runner.config import validate_config
    from cru_harness.validation import ConfigError

    raw = {"name": "t", "output_dir": str(tmp_path), "models": [{"name": "m", "path": "zoo:llama"}],
           "benchmarks": {"tofu": {"splits": ["forget01"]}}, "methods": [{"method": "RMU", "precision": "bf16"}]}
    cell_hparams = validate_config(raw).methods[0].hparams
    assert cell_hparams["precision"] == "bf16"
    raw["methods"] = [{"method": "RMU", "precision": "half"}]
    with pytest.raises(ConfigError, match="precision"):
        validate_config(raw)
