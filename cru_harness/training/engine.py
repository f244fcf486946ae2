"""The training engine: one loop, on `accelerate`, for every method that trains weights (the baselines, TOFU's
fine-tuning and the retain oracles, LUNAR's fit, CRU's routers).

A method gives its loss, its trainable weights and its reference model (`objective.Objective`); the engine owns
devices, precision, accumulation and distribution. Two levels:
- `Engine`: one optimizer step over a group of micro-batches (the exact accumulation below, clipping, the
  schedule). With an accelerator it runs under it (autocast, DDP / FSDP / DeepSpeed); without one it steps the
  weights in place, where they are (CRU's routers beside a device-mapped base, LUNAR's projection, the testbed).
- `train_model`: a whole run of an `Objective` on a dataset: the seeded micro-batch stream, AdamW, the schedule,
  `Engine` steps, the trained model back.

- Mixed precision through `Accelerator(mixed_precision=...)` (autocast around every loss computation; fp16
  adds loss scaling) over fp32 master weights, or `precision: bf16`: bf16 weights and AdamW state stepped directly
  (WMDP's RMU, open-unlearning's bf16 runs), multi-GPU by starting the same script with `accelerate launch` (DDP; gradients are
  synchronised on each process's last micro-batch of a step).
- One stream of micro-batches, whatever the process count: every process draws the stream a single process
  would, and a step's micro-batches are dealt out among the processes. accelerate's own sharding pads an
  uneven last round with repeated examples (its `even_batches`), which made a run on n GPUs train on other
  examples, for other step counts, than the same run on one.
- Gradient accumulation is exact: before a step the loop collects its micro-batches, counts the answer
  tokens and sequences of each sub-batch (forget / retain / alternate) over the whole group, and hands those
  totals to the losses (see `losses.py`), so k micro-batches give the same update as one batch k times
  larger, also when their answer lengths differ.
- AdamW (no weight decay on 1-D parameters: biases and norms, as HF Trainer does), gradient clipping,
  linear warmup then linear / cosine / constant schedule (`transformers.get_scheduler`).
- Deterministic for a seed on CPU: `accelerate.utils.set_seed`, a seeded sampler re-seeded per epoch.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import json
import logging
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration, InitProcessGroupKwargs
from accelerate.data_loader import prepare_data_loader
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_scheduler

from ..devices import (DeviceError, check_dtype_on_device, explain_out_of_memory, is_sharded, launched_processes,
                       load_causal_lm, resolve_device, saved_dtype, training_precision)
from ..errors import InputError
from .objective import Objective, TrainingConfig, default_counts

log = logging.getLogger(__name__)

#: How long a process waits for the others at a collective or barrier (seconds), as HF Trainer's ddp_timeout.
DDP_TIMEOUT_S = 1800
_SCHEDULER_NAMES = {"linear": "linear", "cosine": "cosine", "constant": "constant_with_warmup"}
#: What a step too large for the GPU is told to change, the result-preserving knob first.
OUT_OF_MEMORY_HINT = ("lower micro_batch_size (--micro-batch-size; the effective batch, and so each update, stays "
                      "the same) or max_length (--max-length); a model whose training state does not fit one GPU: "
                      "--device-map auto over several GPUs")


@dataclass
class TrainResult:
    model: torch.nn.Module                       # the unwrapped, trained model
    history: list[dict] = field(default_factory=list)  # one entry per optimizer step
    final_logs: dict = field(default_factory=dict)     # the last step's logs
    optimizer_steps: int = 0
    gradient_accumulation_steps: int = 1
    num_processes: int = 1
    warmup_steps: int = 0


def make_accelerator(config: TrainingConfig, seed: int = 0, device: str | torch.device | None = None) -> Accelerator:
    """An Accelerator for `config` on `device` (`cru_harness.devices` syntax; None/auto = CUDA when present,
    else CPU). accelerate keeps one process-wide state; in a single process (several runs with different
    precisions or devices one after another) that state is reset instead of refusing or reusing it. Under
    `accelerate launch` with several processes a conflicting precision is still an error, and each process
    takes its own GPU, so only `auto`/`cuda` make sense there."""
    launched = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")   # accelerate launch's --mixed_precision
    if launched not in ("", "no") and launched != config.mixed_precision:
        # The run's own precision is passed explicitly, so accelerate would silently ignore the launcher's.
        raise DeviceError(f"ACCELERATE_MIXED_PRECISION={launched} (accelerate launch's --mixed_precision, or an "
                          f"accelerate config) and this run trains in {config.mixed_precision!r}: give the precision "
                          "as the run's dtype (--dtype bfloat16 or float16: fp32 weights under autocast) and launch "
                          "with --mixed_precision no")
    kwargs = dict(mixed_precision=config.mixed_precision,
                  dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=seed),
                  # HF Trainer's ddp_timeout: the other processes wait at a barrier while the main one saves a
                  # checkpoint (28 GB for a 7B model in fp32), longer than NCCL's default 10 minutes allows
                  kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=DDP_TIMEOUT_S))])
    target = resolve_device(device)  # auto: CUDA when present, else CPU
    if target.type == "cpu" and (engine := launched_engine()) is not None:
        # accelerate runs neither on the CPU: its FSDP plugin refuses it, a DeepSpeed config falls back to plain
        # data parallel there (silently: other memory than asked for).
        raise DeviceError(f"accelerate is set up for {engine} (accelerate launch --config_file), which shards over "
                          "GPUs; accelerate runs it on no CPU: launch without the config (data parallel) or on GPUs")
    if target.type == "cpu":
        # accelerate runs several CPU processes (gloo) only when told it is on the CPU.
        kwargs["cpu"] = True
    elif target.index is not None:
        if launched_processes() > 1:
            raise DeviceError(f"device {target} under `accelerate launch` with several processes: each process "
                              "uses its own GPU; pass --device auto or cuda")
        torch.cuda.set_device(target)  # accelerate's single-process "cuda" is the current device
    check_dtype_on_device(torch.bfloat16 if config.mixed_precision == "bf16" else torch.float32, target)
    try:
        accelerator = Accelerator(**kwargs)
    except ValueError as err:
        if "already been initialized" not in str(err):
            raise
        if PartialState().num_processes > 1 and "mixed_precision" in str(err):   # one process cannot reset it
            raise DeviceError(f"under accelerate launch every run in a process keeps the precision of the first "
                              f"(now {config.mixed_precision!r}): launch each precision on its own") from None
        AcceleratorState._reset_state(reset_partial_state=True)  # internal (no public reset); tested
        return Accelerator(**kwargs)
    if accelerator.device.type != target.type and accelerator.num_processes == 1:
        AcceleratorState._reset_state(reset_partial_state=True)  # an earlier run in this process used another device
        accelerator = Accelerator(**kwargs)
    return accelerator


#: accelerate's sharded training (each process holds part of the weights, gradients and optimizer state): FSDP
#: and DeepSpeed (ZeRO-3 in `configs/accelerate/`) train here; Megatron-LM (tensor parallel) does not.
SHARDED_TRAINING = ("FSDP", "DEEPSPEED")
UNSUPPORTED_TRAINING = ("MEGATRON_LM",)


def launched_engine() -> str | None:
    """The sharded engine `accelerate launch --config_file` set up, read from the environment it exports: FSDP,
    DeepSpeed or None."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return "FSDP"
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return "DeepSpeed"
    return None


def distributed_kind(accelerator: Accelerator) -> str:
    """accelerate's distributed type by name: NO, MULTI_CPU, MULTI_GPU, FSDP, DEEPSPEED, ..."""
    return getattr(accelerator.distributed_type, "name", str(accelerator.distributed_type))


def check_data_parallel(accelerator: Accelerator, config: TrainingConfig, device_map=None) -> None:
    """What several processes cannot do, refused before any model is loaded: a batch they cannot share, a
    model sharded by `device_map` (accelerate refuses it in a distributed run, after loading; FSDP / DeepSpeed
    shard it themselves), or an `accelerate config` asking for an engine this loop does not drive."""
    kind = distributed_kind(accelerator)
    if kind in UNSUPPORTED_TRAINING:
        raise DeviceError(f"accelerate is set up for {kind}; this engine trains one process, data parallel (DDP), "
                          "FSDP or DeepSpeed: launch with another accelerate config")
    n = accelerator.num_processes
    config.gradient_accumulation_steps(n)   # a step's micro-batches dealt out to n processes (InputError if not)
    if kind in SHARDED_TRAINING and device_map is not None:
        raise DeviceError(f"device_map={device_map!r} and accelerate's {kind}: {kind} shards the model over the "
                          "processes itself; leave device_map out")
    if n > 1 and device_map is not None:
        raise DeviceError(f"device_map={device_map!r} shards one model over the GPUs, and accelerate launch started "
                          f"{n} processes: use one or the other (a model too large for one GPU: device_map "
                          "'auto' in a single process)")


def prepare_training(config: TrainingConfig, seed: int, *, dtype, device, device_map=None
                     ) -> tuple[TrainingConfig, Accelerator]:
    """(config, accelerator) of a full-parameter run (baselines, fine-tuning), before anything is loaded: the
    dtype's autocast (`devices.training_precision`) unless the config names its own precision, the accelerator
    on `device`, and what several processes cannot share refused (`check_data_parallel`). `precision: bf16`: no
    autocast, whatever the dtype (the bf16 weights compute in bf16)."""
    _, mixed = training_precision(dtype)
    if config.mixed_precision == "no" and mixed != "no" and config.precision != "bf16":
        config = dataclasses.replace(config, mixed_precision=mixed)
    accelerator = make_accelerator(config, seed, device=device)
    if config.precision == "bf16":
        check_dtype_on_device(torch.bfloat16, accelerator.device)
    check_data_parallel(accelerator, config, device_map)
    return config, accelerator


def load_trainee(path: str, accelerator: Accelerator, *, dtype, device, device_map=None,
                 trust_remote_code: bool = False, load_tokenizer: bool = False, frozen_base: bool = False,
                 precision: str = "fp32_master"):
    """(model, tokenizer or None) of a checkpoint to train, in fp32 master weights (`training_precision`), or in
    bf16 with `precision` "bf16" (stepped directly, as WMDP's RMU and open-unlearning's bf16 runs train):
    straight onto the accelerator's device (this process's GPU under a launch; a reference copy is then made
    there, not in host memory), or sharded by `device_map` (then placed by accelerate on `device`'s GPUs).
    A path transformers cannot load (not a checkpoint, not on the Hub) is an `InputError`. `frozen_base` (LoRA:
    only an adapter trains): the weights in `dtype` itself, as they are saved (`devices.saved_dtype`)."""
    if frozen_base and precision == "bf16":
        raise InputError("precision bf16 steps a model's own bf16 weights; a LoRA adapter trains beside a frozen base "
                         "(in the run's dtype): leave precision at fp32_master")
    where = accelerator.device if device_map is None else device
    if distributed_kind(accelerator) in SHARDED_TRAINING:
        where = "cpu"   # FSDP / DeepSpeed place each process's shard on its GPU when the model is prepared
    try:
        model, tokenizer = load_causal_lm(path, device=where,
                                          device_map=device_map,
                                          dtype=saved_dtype(dtype) if frozen_base else torch.bfloat16
                                          if precision == "bf16" else training_precision(dtype)[0],
                                          load_tokenizer=load_tokenizer, trust_remote_code=trust_remote_code)
    except OSError as err:   # transformers' own message names the path and what is missing
        raise InputError(f"cannot load model {path!r}: {err}") from None
    offloaded = sorted(name for name, where in model.hf_device_map.items() if where in ("cpu", "disk")) \
        if is_sharded(model) else []
    if offloaded:
        # accelerate keeps offloaded weights on `meta` between forward passes: the optimizer would step tensors
        # that never get a gradient, and the trained model could not be cast or saved.
        raise DeviceError(f"device_map={device_map!r} put {len(offloaded)} module(s) of {path} on the CPU or disk "
                          f"({', '.join(offloaded[:3])}{', ...' if len(offloaded) > 3 else ''}): the GPUs cannot "
                          "hold its fp32 weights, and offloaded weights do not train; use more or larger GPUs")
    return model, tokenizer


def set_activation_checkpointing(model: torch.nn.Module, on: bool) -> None:
    """The model's own gradient (activation) checkpointing, non-reentrant (what PEFT and FSDP need), on or off."""
    if hasattr(model, "activation_checkpointing_enable"):   # transformers 5's names
        if on:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.activation_checkpointing_disable()
    elif on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


def check_trainable_dtype(model: torch.nn.Module, precision: str = "fp32_master") -> None:
    """A model object trains in its own dtype (a checkpoint path loads fp32 master weights): float16 weights are
    refused (AdamW's eps is 0 in float16, and the fp16 loss scaler cannot unscale float16 gradients), bfloat16
    ones warned about (AdamW stepping them drops every update below half a bf16 step of the weight), unless
    `precision` is "bf16", which asks for exactly that and refuses any other dtype."""
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    if precision == "bf16":
        if dtypes - {torch.bfloat16}:
            raise InputError(f"precision bf16 steps bfloat16 weights; the model's trainable weights are "
                             f"{', '.join(sorted(str(d).removeprefix('torch.') for d in dtypes))}: pass the checkpoint "
                             "path (loaded in bf16), or model.to(torch.bfloat16)")
        return
    if torch.float16 in dtypes:
        raise InputError("the model's trainable weights are float16, which AdamW cannot step: pass the checkpoint "
                         "path with dtype='float16' (fp32 weights under fp16 autocast), or model.float()")
    if torch.bfloat16 in dtypes:
        warnings.warn("the model's trainable weights are bfloat16: AdamW stepping them drops most updates at small "
                      "learning rates; pass the checkpoint path with dtype='bfloat16' for fp32 weights under bf16 "
                      "autocast, as the references train", UserWarning, stacklevel=3)


def freeze_all_but(model: torch.nn.Module, names: list[str] | None, method: str) -> None:
    """Freeze every parameter not in `names` (a method's `trainable_parameters`; None: leave all as they are).
    Before the optimizer and DDP see the model, so neither holds the frozen ones."""
    if names is None:
        return
    wanted = set(names)
    known = {name for name, _ in model.named_parameters()}
    if not wanted or wanted - known:
        raise InputError(f"{method}: trainable parameters {sorted(wanted - known) or '(none)'} are not parameters "
                         f"of {type(model).__name__}")
    for name, param in model.named_parameters():
        param.requires_grad_(name in wanted)


def build_optimizer(model: torch.nn.Module, config: TrainingConfig) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=config.adam_betas, eps=config.adam_eps)


def group_totals(group: list[dict], accelerator: Accelerator | None,
                 counts=None) -> dict[str, dict[str, torch.Tensor]]:
    """Each sub-batch's counts (`counts(key, inputs)`, default `losses.default_counts`: answer tokens, sequences,
    positions) summed over a step's whole group of micro-batches (every process holds the whole group, see
    `train_model`): {key: {name: total}}."""
    counts = counts or (lambda key, inputs: default_counts(inputs))
    totals = {}
    for key in group[0]:
        summed: dict[str, torch.Tensor] = {}
        for mb in group:
            for name, value in counts(key, mb[key]).items():
                # Every count is moved to the accelerator's device (the micro-batches may sit elsewhere).
                value = torch.as_tensor(value)
                value = value.to(accelerator.device if accelerator is not None else value.device, torch.float32)
                summed[name] = summed[name] + value if name in summed else value
        totals[key] = summed
    return totals


def micro_batch_stream(loader: DataLoader, accelerator: Accelerator, seed: int) -> DataLoader:
    """`loader` as accelerate prepares it for a single process (seeded sampler re-seeded per epoch, batches on
    the accelerator's device), on every process: each one sees the whole stream."""
    return prepare_data_loader(loader, accelerator.device, num_processes=1, process_index=0,
                               put_on_device=accelerator.device_placement, rng_types=accelerator.rng_types.copy(),
                               use_seedable_sampler=True, data_seed=seed, non_blocking=accelerator.non_blocking)


def process_share(group: list, process_index: int, num_processes: int) -> list[tuple[object, float]]:
    """The micro-batches of a step this process computes, each with its weight: every `num_processes`-th one
    from `process_index`. A process left without one (a last step shorter than the process count) computes
    the group's first at weight 0: DDP needs every process in each gradient synchronisation."""
    mine = group[process_index::num_processes]
    return [(micro, 1.0) for micro in mine] if mine else [(group[0], 0.0)]


def step_counts(config: TrainingConfig, micro_batches_per_epoch: int, per_step: int) -> tuple[int, int]:
    """(optimizer steps, warmup steps) of a run: `num_epochs` epochs of `micro_batches_per_epoch` micro-batches
    (the whole stream, which every process draws) with a step every `per_step` of them (over all processes).

    Steps: floor(epochs x micro-batches / per_step), at least one; TOFU's floor(epochs x examples / effective
    batch) when the micro-batch divides the examples. Warmup: floor(warmup_epochs x steps per epoch), at least
    one when warmup_epochs > 0, unless `warmup_steps` is given. An epoch's short last group of micro-batches
    shares a step with the next epoch's first ones: a step of its own would add a full-size update per epoch
    (twice the steps on TOFU forget01: 40 examples, batch 32)."""
    per_epoch = micro_batches_per_epoch / per_step
    total = max(1, math.floor(config.num_epochs * micro_batches_per_epoch / per_step))
    if config.warmup_steps is not None:
        warmup = config.warmup_steps
    else:
        warmup = math.floor(config.warmup_epochs * per_epoch + 1e-9)
        warmup = max(1, warmup) if config.warmup_epochs > 0 else 0
    return total, min(warmup, total)


def _without_autocast(model: torch.nn.Module) -> torch.nn.Module:
    """The model as it was before mixed precision put an autocast wrapper on its `forward` (accelerate keeps the
    previous one as `_original_forward`). Left on, the model would go on running under autocast, and the wrapper,
    a method bound on the instance, is a reference cycle that keeps the model (its GPU memory) alive until the
    cyclic collector runs: into the runner's next cell. accelerate's own `keep_fp32_wrapper=False` is not used:
    it unwraps every `__wrapped__`, transformers' decorators on the class's forward included."""
    original = vars(model).pop("_original_forward", None)
    if original is None:
        return model
    if getattr(original, "__self__", None) is model and getattr(original, "__func__", None) is type(model).forward:
        vars(model).pop("forward", None)   # the class's own forward serves, bound on each call
    else:
        model.forward = original            # a forward the instance had before (e.g. accelerate's device hooks)
    return model


class Engine:
    """One optimizer step at a time over a group of micro-batches, exact under accumulation and processes.

    `step(group, loss_fn)`: `loss_fn(micro) -> (loss, logs)`. With `counts` (an objective's `group_counts`),
    each sub-batch's counts are summed over the whole group and handed to the losses as `group_<name>`, so k
    micro-batches give the update of one batch k times larger. With an `accelerator` the group's micro-batches
    are dealt out among its processes (`process_share`) and the gradient is the group's sum on every process;
    without one the step runs in place, in this process (`loss.backward()`, torch's clipping). Then: clip to
    `max_grad_norm`, step the optimizer, the scheduler (per step, unless `scheduler_interval="epoch"`: then
    `end_epoch()` steps it), zero the gradients. Returns the step's logs: the loss terms summed, the other logs
    averaged over the micro-batches, `grad_norm` when clipping, `skipped` under fp16, `lr` (before the step).
    `keep_gradients`: zero them before each step instead, so the last step's gradients stay readable (CRU's
    routers, as `RouterTrainer.step` always left them; a full model frees its gradients after each step).
    """

    def __init__(self, model: torch.nn.Module, optimizer, scheduler=None, *, accelerator: Accelerator | None = None,
                 max_grad_norm: float | None = None, counts=None, fp16: bool = False,
                 scheduler_interval: str = "step", keep_gradients: bool = False):
        if scheduler_interval not in ("step", "epoch"):
            raise ValueError(f"scheduler_interval {scheduler_interval!r}: step or epoch")
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.accelerator, self.max_grad_norm, self.counts = accelerator, max_grad_norm, counts
        self.fp16, self.scheduler_interval = fp16, scheduler_interval
        self.keep_gradients = keep_gradients

    @property
    def num_processes(self) -> int:
        return self.accelerator.num_processes if self.accelerator is not None else 1

    @property
    def sharded(self) -> bool:
        """Whether each process holds part of the weights (FSDP, DeepSpeed ZeRO-3): every process must then run
        the same forward passes, and gradients sync on each one."""
        return self.accelerator is not None and distributed_kind(self.accelerator) in SHARDED_TRAINING

    @property
    def deepspeed(self) -> bool:
        return self.accelerator is not None and distributed_kind(self.accelerator) == "DEEPSPEED"

    def _share(self, group: list) -> list[tuple[object, float]]:
        if self.accelerator is None:
            return [(micro, 1.0) for micro in group]
        share = process_share(group, self.accelerator.process_index, self.num_processes)
        if self.sharded:   # the same count of forward passes everywhere: a sharded forward is a collective
            share += [(group[0], 0.0)] * (-(-len(group) // self.num_processes) - len(share))
        return share

    def step(self, group: list, loss_fn) -> dict:
        acc, model = self.accelerator, self.model
        if self.keep_gradients:
            self.optimizer.zero_grad(set_to_none=True)
        if self.counts is not None:
            totals = group_totals(group, acc, self.counts)
            for micro in group:
                for key, counts in totals.items():
                    micro[key].update({f"group_{name}": total for name, total in counts.items()})
        logs_sum: dict[str, float] = {}
        share = self._share(group)
        for i, (micro, weight) in enumerate(share):
            if acc is None:
                loss, logs = loss_fn(micro)
                (loss * weight if weight != 1.0 else loss).backward()
            elif self.deepspeed:
                # DeepSpeed steps its engine inside the backward of a step's last micro-batch (accelerate's
                # sync_gradients), clipping there to the config's norm, and averages gradients over the processes:
                # the loss carries the process count (the group's gradient is the sum, as below).
                acc.gradient_state._set_sync_gradients(i == len(share) - 1)   # accelerate's own switch
                with acc.autocast():
                    loss, logs = loss_fn(micro)
                acc.backward(loss * (weight * self.num_processes))
            else:
                last = i == len(share) - 1
                sync = contextlib.nullcontext() if last or self.sharded else acc.no_sync(model)
                with sync:
                    with acc.autocast():
                        loss, logs = loss_fn(micro)
                    acc.backward(loss * weight)
            for k, v in logs.items():   # a weight-0 stand-in adds 0 (not 0 x inf), under the same keys
                logs_sum[k] = logs_sum.get(k, 0.0) + (v * weight if weight else 0.0)
        n_proc = self.num_processes
        if n_proc > 1 and not self.deepspeed:
            # DDP / FSDP averaged the gradients over the processes; the group totals are global, so the step's
            # gradient is their sum. Restored here in fp32, not by scaling the loss: under fp16 a loss n times
            # larger overflows the loss scale n times sooner than one process does, skipping other steps.
            for param in model.parameters():
                if param.grad is not None:
                    param.grad.mul_(n_proc)
        if n_proc > 1:   # every process's share of the logs (the same keys everywhere: one method)
            keys = sorted(logs_sum)
            summed = acc.reduce(torch.tensor([logs_sum[k] for k in keys], dtype=torch.float64, device=acc.device),
                                reduction="sum")
            logs_sum = dict(zip(keys, summed.tolist()))
        # "loss" terms are already normalised by the group totals: their sum is the step's loss;
        # the other logs are per-micro-batch means, averaged.
        step_logs = {k: (v if k == "loss" else v / len(group)) for k, v in logs_sum.items()}
        if self.max_grad_norm is not None:
            clip = torch.nn.utils.clip_grad_norm_ if acc is None else acc.clip_grad_norm_
            norm = clip(model.parameters(), self.max_grad_norm)   # DeepSpeed: the norm its step clipped
            if norm is not None:
                step_logs["grad_norm"] = float(norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        skipped = acc is not None and acc.optimizer_step_was_skipped
        if self.scheduler is not None and self.scheduler_interval == "step" and not skipped:
            # HF Trainer's rule: a step fp16's loss scaler skipped (an overflow) leaves the schedule
            self.scheduler.step()
        if not self.keep_gradients:
            self.optimizer.zero_grad(set_to_none=True)
        if self.fp16:
            step_logs["skipped"] = float(skipped)
        step_logs["lr"] = lr
        return step_logs

    def end_epoch(self) -> None:
        """An epoch's end: steps a per-epoch schedule (LUNAR's exponential decay)."""
        if self.scheduler is not None and self.scheduler_interval == "epoch":
            self.scheduler.step()


def check_shardable(method: Objective, accelerator: Accelerator) -> None:
    """A method trained by its own fit (LUNAR) or editing the full weights after training (Task Vector) needs
    whole weights in every process: refused under FSDP / DeepSpeed before anything trains."""
    own = [hook for hook in ("fit", "post_train")
           if getattr(type(method), hook) is not getattr(Objective, hook)]
    if own:
        kind = distributed_kind(accelerator)
        raise DeviceError(f"{method.name} under {kind}: its {' and '.join(own)} works on whole weights, which "
                          f"{kind} shards over the processes; train it in one process or data parallel (DDP)")


def configure_deepspeed(accelerator: Accelerator, config: TrainingConfig) -> None:
    """The DeepSpeed config this engine drives: one micro-batch per engine call, the step's boundary set by the
    engine (`Engine.step`), clipping at the run's `max_grad_norm` (DeepSpeed clips inside its step)."""
    ds = accelerator.state.deepspeed_plugin.deepspeed_config
    ds["train_micro_batch_size_per_gpu"] = config.micro_batch_size
    ds["gradient_accumulation_steps"] = 1
    ds["train_batch_size"] = config.micro_batch_size * accelerator.num_processes
    ds["gradient_clipping"] = config.max_grad_norm if config.max_grad_norm is not None else 0.0


def prepare_reference(accelerator: Accelerator, ref_model: torch.nn.Module) -> torch.nn.Module:
    """The frozen reference of NPO / SimNPO / IdkDPO / DPO / the KL variants sharded as the trained model is: FSDP
    wraps it (evaluation mode); under DeepSpeed it gets an inference engine of the same ZeRO stage (no optimizer),
    the pattern TRL and open-unlearning use, since accelerate prepares one DeepSpeed model per run."""
    ref_model.eval()
    if distributed_kind(accelerator) != "DEEPSPEED":
        return accelerator.prepare_model(ref_model, evaluation_mode=True)
    import deepspeed

    ds = copy.deepcopy(accelerator.state.deepspeed_plugin.deepspeed_config)
    for key in ("optimizer", "scheduler"):
        ds.pop(key, None)
    if ds.get("zero_optimization", {}).get("stage") != 3:
        ds["zero_optimization"] = {"stage": 0}   # stages 1-2 shard optimizer state only, which it has none of
    engine, *_ = deepspeed.initialize(model=ref_model, config=ds)
    engine.eval()
    return engine


def gather_model(accelerator: Accelerator, model: torch.nn.Module) -> torch.nn.Module:
    """The trained weights whole, as a model on the main process's CPU (the others keep their shard): the full
    state dict FSDP / DeepSpeed ZeRO-3 gather (a collective every process joins) loaded into a fresh model of the
    same class and config."""
    state = accelerator.get_state_dict(model)
    unwrapped = _without_autocast(accelerator.unwrap_model(model))
    if not accelerator.is_main_process:
        return unwrapped
    from transformers.initialization import no_init_weights

    # The constructor itself, not `from_config`: under ZeRO-3 that would partition the fresh model again.
    with no_init_weights():   # every weight is overwritten by the gathered one
        whole = type(unwrapped)(copy.deepcopy(unwrapped.config))
    whole.load_state_dict(state)
    return whole.to(next(iter(state.values())).dtype).eval()


#: What `train_model` writes beside accelerate's saved state: the steps taken and their logs.
CHECKPOINT_RECORD = "engine_state.json"


def save_training_state(accelerator: Accelerator, checkpoint_dir, result: TrainResult) -> None:
    """The training state after `result.optimizer_steps` steps (every process joins: a sharded state is saved
    in parts), the record last and atomically, so a state without its record is never resumed."""
    accelerator.save_state(str(checkpoint_dir))
    if accelerator.is_main_process:
        record = Path(checkpoint_dir) / CHECKPOINT_RECORD
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps({"optimizer_steps": result.optimizer_steps, "history": result.history}))
        tmp.replace(record)
    accelerator.wait_for_everyone()


def train_model(model: torch.nn.Module, method: Objective, dataset, *, ref_model=None, seed: int = 0,
                accelerator: Accelerator | None = None, progress: bool = True,
                checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int = 0) -> TrainResult:
    """Train `model` in place with `method.compute_loss` on `dataset` (a `data.ForgetRetainDataset`).

    `checkpoint_dir` with `checkpoint_every` = k > 0: the training state (weights, optimizer, schedule, random
    generators: `accelerator.save_state`) and the steps' logs are saved there every k optimizer steps; a run
    given a directory holding such a state resumes from it: the micro-batch stream is replayed up to that step
    without computing, so the run ends with the weights of one never interrupted (on the CPU, bit for bit)."""
    config = method.config
    if method.needs_ref and ref_model is None:
        raise ValueError(f"{method.name} needs a reference model (a frozen copy of the starting model)")
    if not method.needs_ref and ref_model is not None:
        raise ValueError(f"{method.name} does not use a reference model; pass ref_model=None")
    if ref_model is not None and any(p.requires_grad for p in ref_model.parameters()):
        raise ValueError("the reference model must be frozen (requires_grad=False on every parameter)")
    check_trainable_dtype(model, config.precision)
    accelerator = accelerator or make_accelerator(config, seed)
    set_seed(seed)
    n_proc, rank = accelerator.num_processes, accelerator.process_index
    accum = config.gradient_accumulation_steps(n_proc)
    per_step = config.micro_batches_per_step()  # over all processes

    generator = torch.Generator().manual_seed(seed)
    # a dataset in a fixed order (`ordered`: RMU's joint unit, WMDP's alternating batches) is read unshuffled
    loader = DataLoader(dataset, batch_size=config.micro_batch_size, shuffle=not getattr(dataset, "ordered", False),
                        collate_fn=dataset.collate, generator=generator)
    sharded = distributed_kind(accelerator) in SHARDED_TRAINING
    if sharded:
        check_shardable(method, accelerator)
    method.prepare(model, seed, dataset)
    # frozen before a method's own fit too: the resource record counts the weights it trains by requires_grad
    freeze_all_but(model, method.trainable_parameters(model), method.name)
    fitted = method.fit(model, dataset, seed=seed, progress=progress and accelerator.is_main_process)
    if fitted is not None:
        fitted.model.eval()
        fitted.num_processes = n_proc
        return fitted
    model.train()
    if distributed_kind(accelerator) == "DEEPSPEED":
        configure_deepspeed(accelerator, config)
    optimizer = build_optimizer(model, config)
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = micro_batch_stream(loader, accelerator, seed)
    if ref_model is not None and sharded:
        ref_model = prepare_reference(accelerator, ref_model)
    elif ref_model is not None and not is_sharded(ref_model):
        ref_model = ref_model.to(accelerator.device).eval()  # a sharded reference stays where its map put it

    total_steps, warmup = step_counts(config, len(loader), per_step)
    if warmup >= total_steps and accelerator.is_main_process:
        log.warning(f"{method.name}: the warm-up ({config.warmup_steps if config.warmup_steps is not None else warmup} "
                    f"steps) covers all {total_steps} optimizer steps, so the learning rate never reaches "
                    f"{config.learning_rate:g}")
    scheduler = method.make_scheduler(optimizer, total_steps, warmup, len(loader) / per_step) or get_scheduler(
        _SCHEDULER_NAMES[config.lr_scheduler], optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)

    result = TrainResult(model=model, gradient_accumulation_steps=accum, num_processes=n_proc, warmup_steps=warmup)
    resume_at = 0
    if checkpoint_dir is not None:
        accelerator.register_for_checkpointing(scheduler)
        saved = Path(checkpoint_dir) / CHECKPOINT_RECORD
        if saved.is_file():
            record = json.loads(saved.read_text())
            accelerator.load_state(str(checkpoint_dir))
            resume_at, result.history = record["optimizer_steps"], record["history"]
            result.optimizer_steps = resume_at
    bar = tqdm(total=total_steps, desc=getattr(method, "progress_label", f"unlearn[{method.name}]"),
               disable=not (progress and accelerator.is_main_process),
               dynamic_ncols=True)

    engine = Engine(model, optimizer, scheduler, accelerator=accelerator, max_grad_norm=config.max_grad_norm,
                    counts=method.group_counts, fp16=config.mixed_precision == "fp16")

    replayed = 0

    def optimizer_step(group: list[dict], epoch: int) -> None:
        nonlocal replayed
        if replayed < resume_at:   # a resumed run: this step's update is in the loaded state
            replayed += 1
            bar.update(1)
            return
        step_logs = engine.step(group, lambda micro: method.compute_loss(model, micro, ref_model))
        step_logs.update(epoch=epoch, step=result.optimizer_steps + 1)
        result.history.append(step_logs)
        result.optimizer_steps += 1
        bar.update(1)
        if checkpoint_every and checkpoint_dir is not None and result.optimizer_steps % checkpoint_every == 0 \
                and result.optimizer_steps < total_steps:
            save_training_state(accelerator, checkpoint_dir, result)
        bar.set_postfix({k: f"{step_logs[k]:.4g}" for k in step_logs
                         if k not in ("epoch", "step", "lr", "grad_norm", "skipped")})

    # The epochs are one stream of micro-batches: a step every `per_step` of them, across epoch boundaries, and a
    # tail shorter than a step is dropped (see `step_counts`).
    group: list[dict] = []
    with explain_out_of_memory(f"{method.name} training (micro-batches of {config.micro_batch_size})",
                               OUT_OF_MEMORY_HINT):
        for epoch in range(config.num_epochs):
            if hasattr(dataset, "set_epoch"):
                dataset.set_epoch(epoch)
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            for micro in loader:
                if result.optimizer_steps == total_steps and replayed >= resume_at:
                    break
                group.append(micro)
                if len(group) == per_step:
                    optimizer_step(group, epoch)
                    group = []
        if group and result.optimizer_steps < total_steps:  # fewer micro-batches in all than one step takes
            optimizer_step(group, config.num_epochs - 1)
    bar.close()
    # Under fp16 accelerate's optimizer wrapper is in a reference cycle (its patched step): its Adam moments, 8
    # bytes a parameter, would stay on the GPU after the return until the cyclic collector ran.
    optimizer.state.clear()
    model.eval()
    result.model = gather_model(accelerator, model) if sharded else _without_autocast(accelerator.unwrap_model(model))
    with torch.no_grad():
        method.post_train(result.model, ref_model)
    result.final_logs = dict(result.history[-1]) if result.history else {}
    return result
