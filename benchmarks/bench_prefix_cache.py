"""CRU router training with and without the frozen-prefix cache, side by side in one run on one machine:
wall time per phase, and whether the two bundles are byte-identical (they must be).

    python benchmarks/bench_prefix_cache.py                         # SmolLM2-135M-Instruct, TOFU forget10 rows
    python benchmarks/bench_prefix_cache.py --rows 32 --epochs 5 --out benchmarks/results/prefix_cache_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "prefix_cache_cpu.json"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16, help="first N forget10 rows (default 16)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-dir", default=None, help="folder holding tofu/ (default: env, see data.sources)")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cru_harness.cru import RouterTrainingConfig, train_routers
    from cru_harness.data.corpora import load_corpus
    from cru_harness.testbed.smollm import materialize_smollm2

    torch.set_num_threads(args.threads)
    path = materialize_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    forget = load_corpus(f"forget10[:{args.rows}]", args.data_dir)
    retain = load_corpus("retain90", args.data_dir)
    runs, bundles = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for cache in (True, False):
            config = RouterTrainingConfig(epochs=args.epochs, batch_size=args.batch_size, prefix_cache=cache,
                                          progress=False)
            timings: dict = {}
            started = time.perf_counter()
            bundle = train_routers(model, tokenizer, forget, retain, config, timings=timings)
            wall = time.perf_counter() - started
            directory = bundle.save_pretrained(Path(tmp) / str(cache))
            bundles[cache] = {name: (directory / name).read_bytes() for name in ("cru_bundle.json",
                                                                                 "routers.safetensors")}
            runs.append({"prefix_cache": cache, "wall_s": wall, "steps": bundle.config.metrics["steps"],
                         **{k: timings[k] for k in ("localization_s", "prefix_s", "steps_s", "final_gates_s",
                                                    "prefix_rows")},
                         "forget_gate_mean": bundle.config.metrics["forget_gate_mean"],
                         "retain_gate_mean": bundle.config.metrics["retain_gate_mean"]})
            print(f"prefix cache {'on ' if cache else 'off'}: {wall:7.1f} s  "
                  f"(localization {timings['localization_s']:.1f}, prefix {timings['prefix_s']:.1f}, steps {timings['steps_s']:.1f}, final gates "
                  f"{timings['final_gates_s']:.1f})", flush=True)
    identical = bundles[True] == bundles[False]
    record = {"machine": f"{platform.machine()} CPU, {os.cpu_count()} cores, {args.threads} torch thread(s), shared "
                         "with other jobs",
              "model": "SmolLM2-135M-Instruct (fp32)", "data": f"TOFU forget10[:{args.rows}] / retain90",
              "epochs": args.epochs, "batch_size": args.batch_size, "torch": torch.__version__, "runs": runs,
              "bundles_byte_identical": identical, "speedup": runs[1]["wall_s"] / runs[0]["wall_s"]}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_name(out.name + ".tmp")
    tmp_out.write_text(json.dumps(record, indent=2) + "\n")
    tmp_out.replace(out)
    print(f"router training without / with the prefix cache: {record['speedup']:.2f}x wall; bundles "
          f"{'byte-identical' if identical else 'DIFFER'}; wrote {out}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
