"""GPU cost of CRU against GD and NPO at the paper's scale: a Phi-3-mini-shaped model (random init), TOFU
forget10 rows, each method at its TOFU defaults and each in its own process (so peak memory is its own).

    python benchmarks/bench_gpu_cost.py                                  # phi3-mini shape, fp32 + bf16, CUDA
    python benchmarks/bench_gpu_cost.py --dtypes float32 --methods CRU,GD
    python benchmarks/bench_gpu_cost.py --shape tiny --device cpu --rows 8 --epochs 1 --out /tmp/x.json  # smoke

Writes a list of records (`--out`, default benchmarks/results/gpu_cost.json, or $OUT/gpu_cost.json where $OUT is
set), rewritten after each method so that a run cut short keeps what finished:
    gpu, shape, dtype, method, peak_gib (CUDA max allocated; on the CPU the process's peak RSS), weights_gib,
    s_per_row_epoch (whole unlearning wall time / (forget rows x epochs)), steps, ...
and for CRU the wall time split into localization, prefix passes, router steps and the final gate measurement.
A method that fails records its error (one line) instead of numbers. The table printed at the end states the
issue's goals as ratios from this one run: CRU s_per_row_epoch <= 0.25x GD's, CRU peak <= 1.05x the weights.

Text: the TOFU rows (`--data-dir`, else CRU_HARNESS_TOFU_DIR / CRU_HARNESS_DATA_DIR / CRU_HARNESS_SHARED_DATA)
tokenized by `--tokenizer` (a local tokenizer directory, e.g. Phi-3-mini's) or, by default, a byte-level BPE
trained on the rows themselves (no download); the records give the mean tokens per row either way.
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
METHODS = ("CRU", "GD", "NPO")
DTYPES = ("float32", "bfloat16")
GOAL_TIME_RATIO = 0.25   # CRU s_per_row_epoch / GD's
GOAL_PEAK_RATIO = 1.05   # CRU peak / weights
# On the lent GPU machine only $OUT comes back (benchmarks/gpu_session): the default goes there when it is set.
DEFAULT_OUT = (Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(__file__).resolve().parent / "results") \
    / "gpu_cost.json"

# Phi-3-mini-4k-instruct's shape (3.82B parameters); "tiny" is the same family, small, for the smoke run.
SHAPES = {
    "phi3-mini": dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                      original_max_position_embeddings=4096, sliding_window=2047, tie_word_embeddings=False),
    "tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=256, num_hidden_layers=6, num_attention_heads=4,
                 num_key_value_heads=4, max_position_embeddings=512, original_max_position_embeddings=512,
                 tie_word_embeddings=False),
}


def _tofu_dir(data_dir: str | None) -> str:
    from cru_harness.data.sources import resolve_local_dir

    found = resolve_local_dir("tofu", data_dir)
    if found is None and os.environ.get("CRU_HARNESS_SHARED_DATA"):
        found = resolve_local_dir("tofu", os.environ["CRU_HARNESS_SHARED_DATA"])
    if found is None:
        raise SystemExit("no local TOFU data: pass --data-dir (a folder holding tofu/) or set CRU_HARNESS_TOFU_DIR")
    return str(found)


def _tokenizer(args, texts: list[str]):
    from transformers import AutoTokenizer

    from cru_harness.testbed.tokenizer import train_tokenizer

    if args.tokenizer:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        tokenizer = train_tokenizer(texts, min(SHAPES[args.shape]["vocab_size"], 8192))
    if len(tokenizer) > SHAPES[args.shape]["vocab_size"]:
        raise SystemExit(f"tokenizer has {len(tokenizer)} tokens, more than the {args.shape} shape's vocabulary")
    if tokenizer.pad_token is None:  # e.g. Llama/Phi-3 tokenizers; padded positions are masked out anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def run_one(method: str, dtype_name: str, args) -> dict:
    """One method in this process: build the model, unlearn, measure."""
    import torch
    from transformers import AutoModelForCausalLM, Phi3Config

    from cru_harness.data.corpora import load_corpus_rows, rows_to_texts

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    dtype = getattr(torch, dtype_name)
    data_dir = _tofu_dir(args.data_dir)
    suffix = f"[:{args.rows}]" if args.rows else ""
    forget_rows, forget_origin = load_corpus_rows(f"forget10{suffix}", data_dir)
    retain_rows, retain_origin = load_corpus_rows("retain90", data_dir)
    forget_texts, retain_texts = rows_to_texts(forget_rows, forget_origin), rows_to_texts(retain_rows, retain_origin)
    tokenizer = _tokenizer(args, forget_texts + retain_texts)
    special = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                   eos_token_id=tokenizer.eos_token_id)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Phi3Config(**SHAPES[args.shape], **special), dtype=dtype)
    model.eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    tokens = [len(ids) for ids in tokenizer(forget_texts)["input_ids"]]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    record = {"gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "shape": args.shape, "parameters": sum(p.numel() for p in model.parameters()), "dtype": dtype_name,
              "method": method, "forget_rows": len(forget_rows), "retain_rows": len(retain_rows),
              "forget_tokens_per_row": sum(tokens) / len(tokens),
              "tokenizer": args.tokenizer or "byte-level BPE trained on the TOFU rows",
              "torch": torch.__version__, "cuda": torch.version.cuda}
    started = time.perf_counter()
    if method == "CRU":
        from cru_harness.cru import RouterTrainingConfig, train_routers

        config = RouterTrainingConfig(epochs=args.epochs, progress=False, forget_description=forget_origin,
                                      retain_description=retain_origin)
        timings: dict = {}
        bundle = train_routers(model, tokenizer, forget_texts, retain_texts, config, timings=timings)
        epochs, steps = config.epochs, bundle.config.metrics["steps"]
        record["cru_time_s"] = {k: timings[k] for k in ("localization_s", "prefix_s", "steps_s", "final_gates_s")}
        record["cru_prefix_cache"] = {k: timings[k] for k in ("prefix_cache", "prefix_rows", "prefix_cache_gib",
                                                              "prefix_cache_device")}
        record["cru_gates"] = {k: bundle.config.metrics[k] for k in ("forget_gate_mean", "retain_gate_mean",
                                                                    "retain_gate_rows")}
    else:
        from cru_harness.baselines import make_config, unlearn
        from cru_harness.devices import training_precision

        # as the project trains a baseline in `dtype_name`: fp32 master weights under that dtype's autocast
        master, mixed = training_precision(dtype_name)
        model = model.to(master)
        config = make_config(method, "tofu", "forget10", num_epochs=args.epochs, mixed_precision=mixed)
        result = unlearn(model, tokenizer, forget_rows, retain_rows, method, config, seed=0, progress=False)
        epochs, steps = config.num_epochs, result.optimizer_steps
        record["baseline_config"] = {k: v for k, v in config.to_dict().items()
                                     if k in ("learning_rate", "effective_batch_size", "micro_batch_size",
                                              "mixed_precision", "max_length")}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - started
    if device.type == "cuda":
        peak, source = torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    else:
        peak, source = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "cpu_peak_rss"
    record.update(peak_gib=peak / GIB, peak_source=source, weights_gib=weights / GIB, wall_s=wall, epochs=epochs,
                  s_per_row_epoch=wall / (len(forget_rows) * epochs), steps=steps)
    return record


def _table(records: list[dict]) -> str:
    lines = [f"{'dtype':<9} {'method':<5} {'peak GiB':>9} {'weights':>8} {'s/row/ep':>9} {'steps':>6}  notes"]
    for r in records:
        if "error" in r:
            lines.append(f"{r['dtype']:<9} {r['method']:<5} {'FAILED':>9}  {r['error']}")
            continue
        note = ""
        if r["method"] == "CRU":
            t = r["cru_time_s"]
            note = (f"localize {t['localization_s']:.1f}s, prefix {t['prefix_s']:.1f}s, steps {t['steps_s']:.1f}s, "
                    f"final gates {t['final_gates_s']:.1f}s")
        lines.append(f"{r['dtype']:<9} {r['method']:<5} {r['peak_gib']:9.2f} {r['weights_gib']:8.2f} "
                     f"{r['s_per_row_epoch']:9.4f} {r['steps']:6d}  {note}")
    for dtype in sorted({r["dtype"] for r in records}):
        by = {r["method"]: r for r in records if r["dtype"] == dtype and "error" not in r}
        cru = by.get("CRU")
        if cru is None:
            continue
        on_cuda = cru["peak_source"] == "cuda_max_allocated"

        def verdict(value: float, goal: float) -> str:
            if not on_cuda:
                return " (a CPU run, peak = process RSS: the goals are stated for CUDA runs)"
            return f" (goal <= {goal}: {'met' if value <= goal else 'NOT met'})"

        peak = cru["peak_gib"] / cru["weights_gib"]
        lines.append(f"{dtype}: CRU peak / weights = {peak:.3f}{verdict(peak, GOAL_PEAK_RATIO)}")
        for other in ("GD", "NPO"):
            if other in by:
                ratio = cru["s_per_row_epoch"] / by[other]["s_per_row_epoch"]
                goal = verdict(ratio, GOAL_TIME_RATIO) if other == "GD" else ""
                lines.append(f"{dtype}: CRU / {other} time per forget row and epoch = {ratio:.3f}{goal}; "
                             f"peak {cru['peak_gib'] / by[other]['peak_gib']:.3f}x")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="phi3-mini")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated, from float32,bfloat16")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated, from CRU,GD,NPO")
    parser.add_argument("--epochs", type=int, default=5, help="TOFU default: 5")
    parser.add_argument("--rows", type=int, default=None, help="only the first N forget10 rows (default: all 400)")
    parser.add_argument("--data-dir", default=None, help="folder holding tofu/ (or the tofu folder itself)")
    parser.add_argument("--tokenizer", default=None, help="a local tokenizer directory (default: BPE on the rows)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--one", nargs=2, metavar=("METHOD", "DTYPE"), help=argparse.SUPPRESS)  # internal
    args = parser.parse_args(argv)

    if args.one:
        print(json.dumps(run_one(args.one[0], args.one[1], args)))
        return 0

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for name, chosen, valid in (("method", methods, METHODS), ("dtype", dtypes, DTYPES)):
        bad = [c for c in chosen if c not in valid]
        if bad or not chosen:
            parser.error(f"unknown {name}(s) {bad or chosen}; choose from {', '.join(valid)}")
    _tofu_dir(args.data_dir)  # fail before starting any process
    env = dict(os.environ)
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the baselines' accelerate loop would otherwise pick a GPU
    passthrough = ["--shape", args.shape, "--device", args.device, "--epochs", str(args.epochs)]
    for flag, value in (("--rows", args.rows), ("--data-dir", args.data_dir), ("--tokenizer", args.tokenizer),
                        ("--threads", args.threads)):
        if value is not None:
            passthrough += [flag, str(value)]
    from cru_harness.store import atomic_write_text

    records = []
    out = Path(args.out)

    def save() -> None:   # whole or not at all, after every method
        atomic_write_text(out, json.dumps(records, indent=2) + "\n")

    for dtype in dtypes:
        for method in methods:
            proc = subprocess.run([sys.executable, __file__, "--one", method, dtype, *passthrough],
                                  capture_output=True, text=True, env=env, check=False)
            if proc.returncode == 0:
                records.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            else:
                error = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                records.append({"shape": args.shape, "dtype": dtype, "method": method, "error": error[:500]})
            print(f"{dtype} {method}: " + ("ok" if proc.returncode == 0 else f"FAILED: {records[-1]['error']}"),
                  flush=True)
            save()
    print(_table(records))
    print(f"wrote {out}")
    return 0 if all("error" not in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
