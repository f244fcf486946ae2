"""CRU router training with and without the frozen-prefix cache, side by side in one run on one machine:
wall time per phase, and whether the two bundles are byte-identical (they must be). The two arms alternate
over `--repeats` rounds, each round in the other order (on, off / off, on, ...), so that a load that changes
during the run falls on both; the speedup is the median of the rounds' ratios, and the load average is recorded
before and after.

    python benchmarks/bench_prefix_cache.py --repeats 3    # SmolLM2-135M-Instruct, TOFU forget10[:16]: the
                                                            # committed benchmarks/results/prefix_cache_cpu.json
    python benchmarks/bench_prefix_cache.py --rows 8 --repeats 1 --out /tmp/prefix.json   # a quick look
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
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
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds of both arms (default 3)")
    parser.add_argument("--data-dir", default=None, help="folder holding tofu/ (default: env, see data.sources)")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1 round of both arms")

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
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeats):
            for cache in ((True, False) if round_ % 2 == 0 else (False, True)):
                config = RouterTrainingConfig(epochs=args.epochs, batch_size=args.batch_size, prefix_cache=cache,
                                              progress=False)
                timings: dict = {}
                started = time.perf_counter()
                bundle = train_routers(model, tokenizer, forget, retain, config, timings=timings)
                wall = time.perf_counter() - started
                directory = bundle.save_pretrained(Path(tmp) / f"{round_}-{cache}")
                bundles[(round_, cache)] = {name: (directory / name).read_bytes()
                                            for name in ("cru_bundle.json", "routers.safetensors")}
                runs.append({"round": round_, "prefix_cache": cache, "wall_s": wall,
                             "steps": bundle.config.metrics["steps"],
                             **{k: timings[k] for k in ("localization_s", "prefix_s", "steps_s", "final_gates_s",
                                                        "prefix_rows")},
                             "forget_gate_mean": bundle.config.metrics["forget_gate_mean"],
                             "retain_gate_mean": bundle.config.metrics["retain_gate_mean"]})
                print(f"round {round_ + 1}/{args.repeats} prefix cache {'on ' if cache else 'off'}: {wall:7.1f} s  "
                      f"(localization {timings['localization_s']:.1f}, prefix {timings['prefix_s']:.1f}, steps "
                      f"{timings['steps_s']:.1f}, final gates {timings['final_gates_s']:.1f})", flush=True)
    first = next(iter(bundles.values()))
    identical = all(b == first for b in bundles.values())
    wall = {(r["round"], r["prefix_cache"]): r["wall_s"] for r in runs}
    ratios = [wall[(i, False)] / wall[(i, True)] for i in range(args.repeats)]
    record = {"machine": f"{platform.machine()} CPU, {os.cpu_count()} cores, {args.threads} torch thread(s)",
              "load_average_1_5_15_min": {"before": [round(x, 2) for x in load_before],
                                          "after": [round(x, 2) for x in os.getloadavg()]},
              "command": "python benchmarks/bench_prefix_cache.py " + " ".join(argv if argv is not None
                                                                              else sys.argv[1:]),
              "model": "SmolLM2-135M-Instruct (fp32)", "data": f"TOFU forget10[:{args.rows}] / retain90",
              "epochs": args.epochs, "batch_size": args.batch_size, "torch": torch.__version__, "runs": runs,
              "bundles_byte_identical": identical, "speedup_per_round": ratios,
              "speedup": statistics.median(ratios)}
    from cru_harness.store import atomic_write_text

    out = Path(args.out)
    atomic_write_text(out, json.dumps(record, indent=2) + "\n")
    print(f"router training without / with the prefix cache: {record['speedup']:.2f}x wall (median of "
          f"{', '.join(f'{r:.2f}' for r in ratios)}); bundles "
          f"{'byte-identical' if identical else 'DIFFER'}; wrote {out}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
