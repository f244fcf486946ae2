"""The rules of hyperparameter values, one table for every front end: a runner config (`runner.config`), the
command lines (`unlearn`, `finetune`) and the config dataclasses (`BaselineConfig`, `RouterTrainingConfig`,
`fields_problem` in their `__post_init__`) read the same rules, so a value a config lets through is one training
accepts. Foundation layer: stdlib only (validating a config imports no torch from here)."""
from __future__ import annotations

import math
import numbers
from typing import Any

from .errors import InputError


def bound_problem(value: Any, *, low=None, above=None, high=None, below_high=False, integer=False,
                  optional=False) -> str | None:
    """What is wrong with `value` under one numeric rule (an entry of `HPARAM_BOUNDS`), as a phrase to put after
    its name ("must be > 0, got 0"), or None. `low` / `above`: >= / >; `high`: <=, or < with `below_high`;
    `optional`: None is allowed (the dataclass's "unset")."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"expected a number, got {value!r}"
    if integer and not isinstance(value, numbers.Integral):
        return f"expected an integer, got {value!r}"
    if not math.isfinite(value):   # inf / nan pass an open bound (or have none, as gamma)
        return f"expected a finite number, got {value!r}"
    # `not >=`: NaN fails every bound
    if low is not None and not value >= low:
        return f"must be >= {low}, got {value!r}"
    if above is not None and not value > above:
        return f"must be > {above}, got {value!r}"
    if high is not None and not (value < high if below_high else value <= high):
        return f"must be {'<' if below_high else '<='} {high}, got {value!r}"
    return None


def adam_betas_problem(betas: Any) -> str | None:
    """What is wrong with AdamW's betas (two numbers in [0, 1), torch's rule), or None."""
    if (isinstance(betas, (list, tuple)) and len(betas) == 2
            and not any(bound_problem(beta, low=0, high=1, below_high=True) for beta in betas)):
        return None
    return f"expected two numbers in [0, 1), got {betas!r}"


#: The rule of every numeric hyperparameter, one table for every front end: a config's values are checked against
#: it here (`_number`), and the baselines' and CRU's dataclasses check their fields against it (`fields_problem`, in
#: `BaselineConfig` and `RouterTrainingConfig`: the runner, `cru-harness finetune` / `unlearn` and the Python API),
#: so a value a config lets through is one training accepts. 
# Upper bounds where one means something (10**12 passed a dry run and failed, or ran for ever, later): more epochs,
# rows per batch, router width or rows per task than any run of this harness can use. Each names its reason.
MAX_EPOCHS = 1_000          # TOFU's and RWKU's recipes train 5 and 3
MAX_BATCH = 65_536          # more rows than any forget or retain set (TOFU forget10: 400 rows)
MAX_D_R = 65_536            # wider than any model's hidden size: no longer a bottleneck
MAX_ROWS = 1_000_000        # more rows than any benchmark task holds (TOFU's largest: 4,000)

HPARAM_BOUNDS: dict[str, dict[str, Any]] = {
    "learning_rate": dict(above=0), "weight_decay": dict(low=0),
    "num_epochs": dict(low=1, high=MAX_EPOCHS, integer=True),
    "warmup_epochs": dict(low=0), "warmup_steps": dict(low=0, integer=True, optional=True),
    "effective_batch_size": dict(low=1, high=MAX_BATCH, integer=True),
    "micro_batch_size": dict(low=1, high=MAX_BATCH, integer=True),
    "max_length": dict(low=8, integer=True), "max_grad_norm": dict(above=0, optional=True),
    "adam_eps": dict(above=0), "alpha": dict(low=0), "forget_weight": dict(low=0),
    "beta": dict(above=0),   # NPO / SimNPO / IdkDPO scale their forget term by 2 / beta
    "gamma": dict(),
    "lr": dict(above=0), "epochs": dict(low=1, high=MAX_EPOCHS, integer=True),
    "batch_size": dict(low=1, high=MAX_BATCH, integer=True),
    "lam": dict(low=0), "percentile": dict(above=0, high=100, below_high=True),
    "d_r": dict(low=1, high=MAX_D_R, integer=True),
    "last_k": dict(low=1, integer=True), "final_retain_rows": dict(low=1, integer=True, optional=True),
    "prefix_cache_max_gib": dict(above=0, optional=True),
    "exclude_top_magnitude": dict(low=0, high=100, below_high=True),
    "retain_batch_ratio": dict(low=1, high=MAX_BATCH, integer=True),
    # the baselines beyond the paper's (each dataclass checks these too)
    "layer": dict(low=0, integer=True), "steering_coeff": dict(above=0), "lr_decay": dict(above=0, high=1),
    "beta1": dict(low=0), "beta2": dict(low=0), "ignore_first_n_answer_tokens": dict(low=0, integer=True),
    "scaling_coef": dict(above=0), "whp_alpha": dict(above=0),
}


def fields_problem(settings: Any) -> str | None:
    """What is wrong with a dataclass of settings (the baselines' and CRU's configs), "name: problem" for its first
    field outside its `HPARAM_BOUNDS` rule, or None: the one check both dataclasses run in `__post_init__`."""
    import dataclasses

    for item in dataclasses.fields(settings):
        rule = item.metadata.get("bounds", HPARAM_BOUNDS.get(item.name))
        if rule is not None:
            problem = bound_problem(getattr(settings, item.name), **rule)
            if problem:
                return f"{item.name}: {problem}"
    return None


def seed_problem(seed: Any) -> str | None:
    """What is wrong with a seed, or None: the one rule for a config's `seeds` and every command's --seed, the
    range numpy and accelerate's set_seed accept (outside it every trained cell would fail there)."""
    if bound_problem(seed, low=0, high=2**32, below_high=True, integer=True):
        return f"must be an integer from 0 to 2**32 - 1, got {seed!r}"
    return None


def check_seed(seed: Any, what: str = "--seed") -> int:
    """`seed` if `seed_problem` finds nothing, else an `InputError` naming `what` (a command's flag)."""
    problem = seed_problem(seed)
    if problem:
        raise InputError(f"{what} {problem}")
    return seed


#: The values a method's choice-valued setting takes: the torch-free copy the configs and the command lines read
#: of cru.localize.SELECTIONS, cru.router.INPUT_NORMS, cru.losses.LOSS_SHAPES, cru.sites.GATE_SITES,
#: cru.train.ROUTER_INITS, cru.prefix.CACHE_PLACEMENTS, cru.readings' TOKEN_SCOPES / LOCALIZATION_TOKENS /
#: BLOCK_OUTPUTS, baselines.base.SCHEDULERS / MIXED_PRECISION (a test pins
#: each to the library's).
HPARAM_CHOICES = {"selection": ("variance", "random"), "input_norm": ("none", "rms", "rms_learned"),
                  "suppress_loss": ("linear", "quadratic"), "pass_loss": ("linear", "quadratic"),
                  "gate_site": ("residual", "mlp"), "router_init": ("default", "open"),
                  "lr_scheduler": ("linear", "cosine", "constant"), "mixed_precision": ("no", "fp16", "bf16"),
                  "precision": ("fp32_master", "bf16"),
                  "prefix_cache_placement": ("auto", "cpu", "device"), "prompt_style": ("lunar", "evaluation"),
                  "token_scope": ("all", "answer"), "localization_tokens": ("all", "content"),
                  "block_output": ("block", "hf_hidden_states")}


def as_list(name: str, value, what: str = "values") -> tuple:
    """A setting that takes a list, as a tuple: one string is a list of one; a scalar, a mapping or None is an
    `InputError` naming the setting (a `--set exclude=5` read as 5 reached `tuple(5)`, a TypeError)."""
    from .errors import InputError, excerpt

    if isinstance(value, str):
        return (value,)
    if not isinstance(value, (list, tuple)):
        raise InputError(f"{name}: expected a list of {what}, got {excerpt(value, 80)}")
    return tuple(value)
