"""Resource accounting for any training run (baselines and CRU alike): wall time, peak memory, parameters.

Peak memory is the CUDA allocator's max allocated bytes on GPU (reset when the measurement starts), or on
CPU the process's peak resident set size from `resource.getrusage` — a high-water mark over the whole
process lifetime, so it includes whatever ran earlier in the same process (the record says so, and keeps
the value at the start of the measurement beside it).
"""
from __future__ import annotations

import dataclasses
import resource
import sys
import time
from dataclasses import dataclass

import torch

from ..devices import is_sharded


def peak_rss_bytes() -> int:
    """Process peak RSS in bytes (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


# The CUDA allocator keeps one high-water mark per GPU. A whole runner cell (`runner.loop.CudaPeak`) and the
# training inside it (`ResourceMonitor`) both measure with it, so an inner reset keeps the peak it discards here,
# for the outer measurement to read back (else a cell's peak would omit what ran before its training).
_DISCARDED_PEAKS: dict[int, int] = {}


def _cuda_index(device) -> int:
    index = device if isinstance(device, int) else torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def begin_cuda_peak(device) -> None:
    """Start measuring GPU `device`'s peak allocated memory from now (`cuda_peak` reads it). Initialises CUDA
    first: resetting an uninitialised device's counter raises ("did you call init?"), as it would on the first
    cell of a process that has not touched the GPU yet."""
    torch.cuda.init()
    index = _cuda_index(device)
    _DISCARDED_PEAKS.pop(index, None)
    torch.cuda.reset_peak_memory_stats(index)


def restart_cuda_peak(device) -> None:
    """Reset GPU `device`'s counter for a measurement nested in another (training inside a cell), keeping the
    discarded peak for the outer one's `cuda_peak`."""
    torch.cuda.init()
    index = _cuda_index(device)
    _DISCARDED_PEAKS[index] = max(_DISCARDED_PEAKS.get(index, 0), int(torch.cuda.max_memory_allocated(index)))
    torch.cuda.reset_peak_memory_stats(index)


def cuda_peak(device) -> int:
    """Peak allocated bytes on GPU `device` since `begin_cuda_peak`, nested restarts included."""
    index = _cuda_index(device)
    return max(int(torch.cuda.max_memory_allocated(index)), _DISCARDED_PEAKS.get(index, 0))


def count_parameters(model: torch.nn.Module, trainable_only: bool = True) -> int:
    """Number of parameters (trainable ones only by default); shared tensors counted once."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


@dataclass
class ResourceRecord:
    wall_time_s: float
    peak_memory_bytes: int
    peak_memory_source: str          # "cuda_max_allocated" | "process_peak_rss"
    device: str                      # the device measured; a sharded model's GPUs, comma-separated (the max)
    peak_memory_at_start_bytes: int  # for RSS: the process high-water mark before the measurement
    trainable_params: int | None = None
    total_params: int | None = None
    processes: int = 1               # under accelerate launch: time and memory are the max over the processes

    @property
    def peak_memory_mib(self) -> float:
        return self.peak_memory_bytes / 2**20

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["peak_memory_mib"] = round(self.peak_memory_mib, 3)
        return d


class ResourceMonitor:
    """Context manager measuring a block: `with ResourceMonitor(device, model=model) as mon: ...; mon.record`.

    `model` (optional) is counted when the block ends (so parameters frozen or added inside are reflected).
    """

    def __init__(self, device: torch.device | str | None = None, model: torch.nn.Module | None = None):
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.model = model
        self.record: ResourceRecord | None = None
        # a model a device_map split over several GPUs: each of them is measured (the record keeps the max)
        shards = sharded_gpus(model) if model is not None else []
        self.gpus = shards or ([self.device] if self.device.type == "cuda" else [])

    @property
    def _cuda(self) -> bool:
        return bool(self.gpus) and torch.cuda.is_available()

    def __enter__(self) -> "ResourceMonitor":
        if self._cuda:
            for gpu in self.gpus:
                torch.cuda.synchronize(gpu)
                restart_cuda_peak(gpu)
            self._start_mem = max(torch.cuda.max_memory_allocated(gpu) for gpu in self.gpus)
        else:
            self._start_mem = peak_rss_bytes()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self._cuda:
            for gpu in self.gpus:
                torch.cuda.synchronize(gpu)
            peak = max(torch.cuda.max_memory_allocated(gpu) for gpu in self.gpus)
            source, device = "cuda_max_allocated", ",".join(str(gpu) for gpu in self.gpus)
        else:
            peak, source, device = peak_rss_bytes(), "process_peak_rss", str(self.device)
        wall = time.perf_counter() - self._t0
        self.record = ResourceRecord(
            wall_time_s=wall, peak_memory_bytes=int(peak), peak_memory_source=source, device=device,
            peak_memory_at_start_bytes=int(self._start_mem),
            trainable_params=count_parameters(self.model) if self.model is not None else None,
            total_params=count_parameters(self.model, trainable_only=False) if self.model is not None else None,
        )


def sharded_gpus(model: torch.nn.Module) -> list[torch.device]:
    """The GPUs a device_map split `model` over (none unless it is split over several devices)."""
    if not is_sharded(model):
        return []
    gpus = set()
    for where in model.hf_device_map.values():
        if isinstance(where, int):
            gpus.add(where)
        elif str(where).startswith("cuda"):
            gpus.add(_cuda_index(where))
    return [torch.device("cuda", index) for index in sorted(gpus)]


def max_over_processes(record: ResourceRecord, accelerator) -> ResourceRecord:
    """Under accelerate launch each process measured its own GPU (their micro-batches differ): the record takes
    the largest wall time and peak over the processes. A collective: every process calls it."""
    if accelerator.num_processes == 1:
        return record
    mine = torch.tensor([record.wall_time_s, float(record.peak_memory_bytes)], dtype=torch.float64,
                        device=accelerator.device)
    wall, peak = accelerator.reduce(mine, reduction="max").tolist()
    return dataclasses.replace(record, wall_time_s=wall, peak_memory_bytes=int(peak),
                               processes=accelerator.num_processes)


RESOURCE_KEYS = ("wall_time_s", "peak_memory_bytes")   # recorded as train_<key>


def record_resources(outcome: dict, record: dict) -> None:
    """A training resource record into a cell's outcome (`train_wall_time_s`, `train_peak_memory_bytes`, ...)."""
    outcome["resources"].update({f"train_{k}" if k in RESOURCE_KEYS else k: v for k, v in record.items()})
