"""RWKU's settings of the methods (`api.Benchmark.method_defaults`, `method_settings`, `lora_preset`).

Trainer defaults follow RWKU's LLaMA-Factory scripts (scripts/full/run_{ga,npo,dpo}.sh: cosine schedule, 20 warmup
steps, 3 epochs, cutoff 512, LLaMA-Factory's weight decay 0, per-method lr / batch / beta). Those were tuned for 8B
models: a tiny model needs its own learning rate, which an experiment config states."""
from __future__ import annotations

from typing import Any

#: Every trained method's schedule on RWKU (LLaMA-Factory's, RWKU scripts/full/run_*.sh).
SCHEDULE = dict(num_epochs=3, lr_scheduler="cosine", warmup_steps=20, weight_decay=0.0, max_length=512)

# RWKU scripts/full/run_ga.sh (Llama-3-8B-Instruct): lr 6e-8, batch 8, 3 epochs, cosine, warmup 20.
_GA = dict(learning_rate=6e-8, effective_batch_size=8)
# RWKU scripts/full/run_npo.sh: lr 2e-6, dpo_beta 0.2, batch 16, forget corpus only (no retain term).
_NPO = dict(learning_rate=2e-6, beta=0.2, effective_batch_size=16, alpha=0.0)
# RWKU scripts/full/run_dpo.sh: lr 5e-6, batch 2 x 4 accumulation = 8, LLaMA-Factory's dpo_beta 0.1, no auxiliary
# retain loss (dpo_ftx 0), trl's sigmoid loss (factor 1). DPO: the same values (RWKU's run_dpo.sh).
_DPO = dict(learning_rate=5e-6, effective_batch_size=8, alpha=0.0, loss_scale=1.0)
# MUSE's fine-tuning recipe (baselines/finetune.py, the scripts' FT_* settings), on every benchmark: the reinforced
# model of Task Vector and WHP.
_MUSE_FINETUNE = dict(num_epochs=10, learning_rate=1e-5, lr_scheduler="cosine", warmup_epochs=0.0,
                      warmup_steps=None, weight_decay=0.0, effective_batch_size=32, max_grad_norm=1.0)
# RMU: RWKU ships no RMU script; WMDP's Zephyr-7B run (its README and rmu/unlearn.py: steering 6.5, alpha 1200,
# layer 7, lr 5e-5, batches of 4, one pass, constant rate, `transformers.AdamW` at its defaults, eps 1e-6), as on
# WMDP, stated in full so that a cell's hash says which setting trained it.
_WMDP_ZEPHYR = dict(layer=7, steering_coeff=6.5, alpha=1200.0, learning_rate=5e-5, lr_scheduler="constant",
                    warmup_epochs=0.0, weight_decay=0.0, effective_batch_size=4, micro_batch_size=4, num_epochs=1,
                    max_grad_norm=None, max_length=512, adam_eps=1e-6)

#: Per method, over `SCHEDULE` (the method's name as configs give it).
TRAINER_DEFAULTS: dict[str, dict[str, Any]] = {
    "GA": _GA,
    # RWKU ships no GD script; the project uses GA's schedule (lr 6e-8, batch 8) plus the retain term (GD-KL: GD's).
    "GD": _GA,
    "GD-KL": _GA,
    "NPO": _NPO,
    "NPO-KL": {**_NPO, "alpha": 1.0},   # NPO's, with its KL retain term on
    # Not in RWKU's code: the project runs SimNPO on RWKU with NPO's RWKU schedule and the forget05 strength,
    # forget corpus only.
    "SimNPO": dict(learning_rate=2e-6, effective_batch_size=16, beta=2.5, forget_weight=0.1375, alpha=0.0),
    "IdkDPO": _DPO,
    "DPO": _DPO,
    # RWKU scripts/full/run_rt.sh: lr 4e-7, batch 8, no retain term
    "RT": dict(learning_rate=4e-7, effective_batch_size=8, alpha=0.0),
    "RMU": dict(_WMDP_ZEPHYR, warmup_steps=None),   # not RWKU's 20 warm-up steps
    # not RWKU's schedule: LUNAR's own fit (LUNARConfig's: 20 epochs at a constant rate, torch AdamW's weight decay)
    "LUNAR": dict(num_epochs=20, lr_scheduler="constant", warmup_steps=None, weight_decay=0.01),
    "TaskVector": _MUSE_FINETUNE,
    "WHP": _MUSE_FINETUNE,
}

#: The CRU paper's RWKU setting where it differs from its TOFU one (paper: lambda 50, p 90, d_r 256 on RWKU;
#: `RouterTrainingConfig`'s defaults are the TOFU setting); RMU: WMDP's run (`_WMDP_ZEPHYR`). In each cell's
#: hyperparameters (its hash).
METHOD_SETTINGS: dict[str, dict[str, Any]] = {"CRU": {"lam": 50, "percentile": 90, "d_r": 256}, "RMU": _WMDP_ZEPHYR}

#: RWKU's LoRA runs (LLaMA-Factory/scripts/lora/run_*_lora.sh: `--finetuning_type lora --lora_target
#: q_proj,v_proj`, LLaMA-Factory's defaults rank 8, alpha 2 x rank, dropout 0).
LORA = dict(r=8, alpha=16.0, dropout=0.0, target_modules=("q_proj", "v_proj"))


def method_defaults(method: str) -> dict[str, Any]:
    return {**SCHEDULE, **TRAINER_DEFAULTS.get(method, {})}
