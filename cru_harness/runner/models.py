"""Models of a run: where a model path points (testbed zoo, offline SmolLM2, a directory or Hub id), which
device and dtype a cell uses, and loading. The one place the runner turns a config's device/dtype into torch's."""
from __future__ import annotations

import functools
import time
from typing import Callable

from ..testbed.names import is_builtin_model, resolve_data_dir, resolve_model_path  # noqa: F401 - the runner's names
from .config import ModelSpec


def local_builds(config) -> list[str]:
    """The built-in models a config needs (`zoo:` checkpoints incl. retain oracles, `smollm2`), without duplicates."""
    paths: list[str] = []
    for model in config.models:
        candidates = [model.path] + [spec.value for spec in model.retain.values() if spec.kind == "checkpoint"]
        for path in candidates:
            if is_builtin_model(path) and path not in paths:
                paths.append(path)
    return paths


def prebuild_local_models(config, *, workers: int = 2, log: Callable[[str], None] = print) -> None:
    """Build the config's missing built-in models up front, `workers` processes at a time.

    Each build is single-threaded by design (testbed.zoo._build_threads: deterministic, and fastest for tiny
    models), so on a cold cache two builds side by side use both cores instead of one. Builds are cached and
    locked per entry: a model already built is a no-op, and the cells later find it in the cache.
    """
    paths = local_builds(config)
    if not paths:
        return
    import concurrent.futures
    import multiprocessing

    t0 = time.perf_counter()
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch state shared with this one
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, min(workers, len(paths))),
                                                mp_context=context) as pool:
        futures = {path: pool.submit(resolve_model_path, path) for path in paths}
        for path, future in futures.items():
            try:
                log(f"model {path}: {future.result()}")
            except Exception as err:  # noqa: BLE001 - each cell of this model records the error itself
                log(f"model {path} could not be built ({type(err).__name__}: {err}); its cells will fail with it")
    log(f"built-in models ready in {time.perf_counter() - t0:.1f}s")


def resolve_device(device: str) -> str:
    """A config's `device` (`cru_harness.devices`): `auto` = cuda when available, else cpu; a CUDA device that
    is not there is a `DeviceError` naming it."""
    from ..devices import resolve_device as resolve

    return str(resolve(device))


@functools.lru_cache(maxsize=None)
def _checkpoint_dtype(path: str, trust_remote_code: bool) -> str:
    from ..devices import checkpoint_dtype

    return checkpoint_dtype(resolve_model_path(path), trust_remote_code=trust_remote_code)


def model_dtype(model: ModelSpec, phase: str = "train") -> str:
    """The dtype name a model's cells use in `phase`: "train" (loading, training, the frozen base of CRU) =
    `dtype`; "eval" (scoring) = `eval_dtype`, else `dtype`. `auto` is resolved once, against the model's own
    checkpoint (`path`), so every method's checkpoint of the model trains and is scored in the same dtype."""
    if phase not in ("train", "eval"):
        raise ValueError(f"phase {phase!r}: expected 'train' or 'eval'")
    name = (model.eval_dtype or model.dtype) if phase == "eval" else model.dtype
    return _checkpoint_dtype(model.path, model.trust_remote_code) if name in (None, "auto") else name


def load_model(path: str, cell, dtype: str | None = None):
    """(model, tokenizer) for a cell (`load_model_of` its model on its configured device)."""
    return load_model_of(cell.model, path, cell.device, dtype)


def load_model_of(model: ModelSpec, path: str, device: str, dtype: str | None = None):
    """(model, tokenizer) of `path` for a config's model: on `device`, or sharded by the model's `device_map`, in
    `dtype` (default: the model's training dtype, `model_dtype`), through `cru_harness.devices.load_causal_lm`."""
    from ..devices import load_causal_lm

    return load_causal_lm(path, device=device, device_map=model.device_map,
                          dtype=dtype or model_dtype(model), trust_remote_code=model.trust_remote_code)
