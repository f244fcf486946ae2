"""WMDP's settings of the methods (`api.Benchmark.method_defaults`, `method_settings`)."""
from __future__ import annotations

from typing import Any

#: WMDP's protocol rule: every passage-training method gets RMU's data budget and schedule (one pass over the
#: benchmark's 600 forget passages in batches of 4, constant rate, no warm-up or weight decay, 512 tokens, WMDP's
#: rmu/unlearn.py); its learning rate is the one the baselines' one-rate rule picks (docs/methods.md)
SCHEDULE = dict(num_epochs=1, effective_batch_size=4, micro_batch_size=4, lr_scheduler="constant",
                warmup_epochs=0.0, warmup_steps=None, weight_decay=0.0, max_length=512)

#: WMDP's own RMU run for Zephyr-7B (its README: `--max_num_batches 150 --batch_size 4 --steering_coeffs 6.5
#: --alpha 1200 --lr 5e-5`; rmu/unlearn.py: layer_id 7, layer_ids 5,6,7, param_ids 6, one pass, `transformers.AdamW`
#: at its defaults, eps 1e-6 and no weight decay, without clipping, constant rate), stated in full so that a WMDP cell's hash says which setting trained it
#: whatever the dataclass's defaults become. 150 batches of 4 are the benchmark's 600 forget passages (its corpora).
#: Sources: centerforaisafety/wmdp rmu/unlearn.py and its README's Zephyr-7B run; open-unlearning
#: configs/trainer/RMU.yaml (layers 5-7 down_proj).
WMDP_ZEPHYR = dict(layer=7, steering_coeff=6.5, alpha=1200.0, learning_rate=5e-5, lr_scheduler="constant",
                   warmup_epochs=0.0, weight_decay=0.0, effective_batch_size=4, micro_batch_size=4, num_epochs=1,
                   max_grad_norm=None, max_length=512, adam_eps=1e-6)

#: In each cell's hyperparameters (its hash). CRU: the paper has no WMDP setting; its passage setting (RWKU's:
#: lambda 50, p 90, d_r 256) is taken, this project's choice (docs/cru_method.md).
METHOD_SETTINGS: dict[str, dict[str, Any]] = {"RMU": WMDP_ZEPHYR, "CRU": {"lam": 50, "percentile": 90, "d_r": 256}}


def method_defaults(method: str) -> dict[str, Any]:
    return {**SCHEDULE, **(WMDP_ZEPHYR if method == "RMU" else {})}
