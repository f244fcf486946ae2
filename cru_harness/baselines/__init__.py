"""Unlearning baselines (GA, GD, NPO, SimNPO, IdkDPO, + the ICU marker; GD-KL, NPO-KL, RMU, LUNAR, UNDIAL, SatImp,
WGA, CE-U, DPO, RT, Task Vector, WHP), one module each behind a registry, trained by one accelerate loop.
Entry point: `unlearn(...)`; configs: `make_config(name, benchmark, split)`."""
from . import (  # noqa: F401  (registration side effects)
    ceu, dpo, ga, gd, gd_kl, icu, idkdpo, lunar, npo, npo_kl, rmu, rt, satimp, simnpo, task_vector, undial, wga, whp)
from .base import BaselineConfig, RetainConfig, UnlearningMethod
from ..lazy import lazy_exports
from .registry import METHODS, get_method, make_config, register_method

# `unlearn` and the resource monitor are exported lazily (PEP 562): listing the methods (`cru-harness methods`)
# imports this package, and must not import the training loop's transformers, accelerate and peft with it.
_LAZY = {"ResourceMonitor": "..training.resources", "ResourceRecord": "..training.resources",
         "count_parameters": "..training.resources", "peak_rss_bytes": "..training.resources",
         "UnlearnResult": ".api", "unlearn": ".api"}

__getattr__ = lazy_exports(__name__, globals(), _LAZY)


__all__ = [
    "METHODS", "get_method", "make_config", "register_method", "BaselineConfig", "RetainConfig",
    "UnlearningMethod", "unlearn", "UnlearnResult", "ResourceMonitor", "ResourceRecord", "count_parameters",
    "peak_rss_bytes",
]
