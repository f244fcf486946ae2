"""Memory and time of one training engine at scale: full-parameter, FSDP, DeepSpeed ZeRO-3 and LoRA training of a
Phi-3-mini-shaped model (random weights, no download), each in processes of its own so that each peak is its own.

    python benchmarks/bench_scale.py                                   # phi3-mini shape, every mode, CUDA
    python benchmarks/bench_scale.py --modes lora,fsdp --num-processes 8
    python benchmarks/bench_scale.py --shape tiny --device cpu --steps 2 --out /tmp/x.json   # smoke, seconds

Each mode trains `--steps` optimizer steps of answer-token NLL on random token rows (`--batch` rows of
`--seq-len` tokens a step, micro-batches of `--micro-batch`) through `cru_harness.training.train_model`, the loop
every method trains with, at fp32 master weights under bf16 autocast (`--dtype bfloat16`, the default on CUDA):
- full: one process, all weights trained (AdamW: ~16 bytes a parameter, plus activations);
- lora: one process, a LoRA adapter (RWKU's r 8, alpha 16, on Phi-3's fused qkv_proj) on the frozen base in
  `--dtype`;
- fsdp / zero3: `accelerate launch --config_file configs/accelerate/{fsdp,zero3}.yaml --num_processes N`.
Writes a list of records (`--out`, default benchmarks/results/scale.json, or $OUT/scale.json where $OUT is set),
rewritten after each mode: mode, shape, parameters, processes, peak_gib per process (CUDA max allocated; on the
CPU the process's peak RSS), s_per_step (wall time of the steps after the first / their count), trainable
parameters. A mode that fails, or cannot run here (FSDP / ZeRO-3 need GPUs: accelerate runs neither on the CPU),
records its reason instead of numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

GIB = 1024 ** 3
MODES = ("full", "lora", "fsdp", "zero3")
REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = (Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "benchmarks" / "results") / "scale.json"

# Phi-3-mini-4k-instruct's shape (3.82B parameters), as bench_gpu_cost.py; "tiny": the same family, small.
SHAPES = {
    "phi3-mini": dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                      original_max_position_embeddings=4096, tie_word_embeddings=False),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 pad_token_id=0, bos_token_id=1, eos_token_id=2,
                 num_key_value_heads=4, max_position_embeddings=256, original_max_position_embeddings=256,
                 tie_word_embeddings=False),
}


def worker(args) -> dict:
    """One mode, in this process (launched by accelerate for fsdp / zero3)."""
    import torch
    from transformers import Phi3Config, Phi3ForCausalLM

    from cru_harness.training import Objective, TrainingConfig, prepare_training, train_model
    from cru_harness.training.lora import LoraSettings, add_lora
    from cru_harness.training.objective import IGNORE_INDEX

    class Rows(torch.utils.data.Dataset):
        def __init__(self, n, seq_len, vocab):
            generator = torch.Generator().manual_seed(0)
            self.ids = torch.randint(3, vocab, (n, seq_len), generator=generator)

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return self.ids[i]

        def collate(self, items):
            ids = torch.stack(items)
            labels = ids.clone()
            labels[:, : ids.shape[1] // 2] = IGNORE_INDEX   # a prompt half, an answer half
            return {"train": {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}}

    class NLL(Objective):
        name = "bench"

        def compute_loss(self, model, batch, ref_model=None):
            inputs = batch["train"]
            logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
            summed = torch.nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2),
                                                       inputs["labels"][:, 1:], ignore_index=IGNORE_INDEX,
                                                       reduction="sum")
            loss = summed / inputs["group_tokens"]
            return loss, {"loss": float(loss.detach())}

    config = TrainingConfig(learning_rate=1e-5, num_epochs=1, warmup_epochs=0.0, lr_scheduler="constant",
                            effective_batch_size=args.batch, micro_batch_size=args.micro_batch,
                            max_length=args.seq_len)
    config, accelerator = prepare_training(config, 0, dtype=args.dtype, device=args.device)
    torch.manual_seed(0)
    lora = args.mode == "lora"
    model = Phi3ForCausalLM(Phi3Config(**SHAPES[args.shape]))
    if lora:
        # RWKU's preset, on Phi-3's fused attention projection (it has no separate q_proj / v_proj)
        model = add_lora(model.to(getattr(torch, args.dtype)),
                         LoraSettings.from_dict({"preset": "rwku", "target_modules": ["qkv_proj"]}))
    parameters = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if accelerator.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(accelerator.device)
    times = []

    class Timed(NLL):   # the wall time of each optimizer step, read at its first micro-batch
        def compute_loss(self, model, batch, ref_model=None):
            times.append(time.perf_counter())
            return super().compute_loss(model, batch, ref_model)

    dataset = Rows(args.batch * args.steps, args.seq_len, SHAPES[args.shape]["vocab_size"])
    started = time.perf_counter()
    result = train_model(model, Timed(config), dataset, seed=0, accelerator=accelerator, progress=False)
    wall = time.perf_counter() - started
    per_step = len(times) // max(1, result.optimizer_steps)   # micro-batch calls per step on this process
    firsts = times[::per_step] if per_step else times
    steady = (time.perf_counter() - firsts[1]) / (len(firsts) - 1) if len(firsts) > 1 else wall
    if accelerator.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(accelerator.device)
    else:
        scale = 1 if sys.platform == "darwin" else 1024   # ru_maxrss: bytes on macOS, KiB on Linux
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    peaks = accelerator.gather(torch.tensor([float(peak)], device=accelerator.device)).tolist()
    return {"mode": args.mode, "shape": args.shape, "dtype": args.dtype, "device": str(accelerator.device),
            "processes": accelerator.num_processes, "parameters": parameters, "trainable_parameters": trainable,
            "peak_gib": max(peaks) / GIB, "peak_gib_per_process": [p / GIB for p in peaks],
            "s_per_step": steady, "steps": result.optimizer_steps, "batch": args.batch, "seq_len": args.seq_len,
            "micro_batch": args.micro_batch, "final_loss": result.final_logs.get("loss"), "wall_s": wall}


def run_mode(args, mode: str) -> dict:
    """`mode` in processes of its own; its record, or its reason for not running."""
    import torch

    base = {"mode": mode, "shape": args.shape, "dtype": args.dtype}
    if mode in ("fsdp", "zero3") and (args.device == "cpu" or not torch.cuda.is_available()):
        return {**base, "skipped": f"{mode} needs GPUs: accelerate runs neither FSDP nor DeepSpeed on the CPU"}
    if mode == "zero3":
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            return {**base, "skipped": "zero3 needs DeepSpeed: pip install deepspeed"}
    worker_args = [str(Path(__file__).resolve()), "--worker", "--mode", mode, "--shape", args.shape,
                   "--dtype", args.dtype, "--device", args.device, "--steps", str(args.steps),
                   "--batch", str(args.batch), "--micro-batch", str(args.micro_batch), "--seq-len", str(args.seq_len)]
    if mode in ("fsdp", "zero3"):
        config = REPO / "configs" / "accelerate" / f"{mode}.yaml"
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                   "--num_processes", str(args.num_processes), "--mixed_precision", "no"] + worker_args
    else:
        command = [sys.executable] + worker_args
    with __import__("tempfile").TemporaryDirectory() as tmp:
        record_path = Path(tmp) / "record.json"
        proc = subprocess.run(command + ["--record", str(record_path)], capture_output=True, text=True,
                              env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
        if proc.returncode != 0 or not record_path.exists():
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            return {**base, "error": last[:500]}
        return json.loads(record_path.read_text())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="phi3-mini")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bfloat16 on CUDA)")
    parser.add_argument("--device", default="auto", help="auto, cuda or cpu")
    parser.add_argument("--num-processes", type=int, default=None, help="fsdp / zero3 processes (default: GPUs)")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps a mode (the first is not timed)")
    parser.add_argument("--batch", type=int, default=8, help="rows a step (the effective batch)")
    parser.add_argument("--micro-batch", type=int, default=2, help="rows a micro-batch")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens a row (TOFU rows: ~100-300)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--record", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available() and args.device != "cpu"
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    args.num_processes = args.num_processes or max(1, torch.cuda.device_count())
    if args.worker:
        record = worker(args)
        from accelerate.state import PartialState

        if PartialState().is_main_process:
            args.record.write_text(json.dumps(record))
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    records = []
    for mode in modes:
        records.append(run_mode(args, mode))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(records, indent=1))
        tmp.replace(args.out)   # whole or not at all
        r = records[-1]
        status = r.get("skipped") or r.get("error") or \
            f"peak {r['peak_gib']:.2f} GiB/process, {r['s_per_step']:.3f} s/step, {r['processes']} process(es)"
        print(f"{mode:>6}: {status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
