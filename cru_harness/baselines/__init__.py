"""Unlearning baselines (GA, GD, NPO, SimNPO, IdkDPO, + the ICU marker; GD-KL, NPO-KL, RMU, LUNAR, UNDIAL, SatImp,
WGA, CE-U, DPO, RT, Task Vector, WHP), one module each behind a registry, trained by one accelerate loop.
Entry point: `unlearn(...)`; configs: `make_config(name, benchmark, split)`."""
from . import (  # noqa: F401  (registration side effects)
    ceu, dpo, ga, gd, gd_kl, icu, idkdpo, lunar, npo, npo_kl, rmu, rt, satimp, simnpo, task_vector, undial, wga, whp)
from .base import BaselineConfig, RetainConfig, UnlearningMethod
from .registry import METHODS, get_method, make_config, register_method
from ..training.resources import ResourceMonitor, ResourceRecord, count_parameters, peak_rss_bytes
from .api import UnlearnResult, unlearn

__all__ = [
    "METHODS", "get_method", "make_config", "register_method", "BaselineConfig", "RetainConfig",
    "UnlearningMethod", "unlearn", "UnlearnResult", "ResourceMonitor", "ResourceRecord", "count_parameters",
    "peak_rss_bytes",
]
