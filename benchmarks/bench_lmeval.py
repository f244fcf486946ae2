"""Wall time of the project's lm-eval tasks under `--model cru` (with and without routers) vs `--model hf`.

Two parts, on the offline real model SmolLM2-135M-Instruct (`materialize_smollm2()`, or `--model PATH`), on the
CPU or, with `--device cuda`, on a GPU (then the report also goes to benchmarks/results/lmeval_overhead_gpu.json
unless --json-out says otherwise, and records the GPU, torch and CUDA versions):

Part 1 (default) -- overhead of `cru` vs `hf`, side by side in one process:
  * A small router bundle is trained once (last 4 blocks, p=90, d_r=32, 20 steps: 32 RWKU target-1 passages
    vs 32 passages of targets 2-3, batch 8; the recipe of tests/test_cru_models.py) and saved to a temp dir.
    Training time is reported but is not part of any ratio.
  * Two lm objects are constructed once, before timing (model loading is NOT timed):
      hf   = lm-eval's HFLM(pretrained=SmolLM2, dtype, batch_size)
      cru  = CRULM(base=SmolLM2, routers=<bundle dir>, same dtype / batch_size)
    Three arms are timed: `hf`, `cru_base` (the same CRULM instance inside `lm.without_routers()`: CRULM's own
    scoring loop with per-token stats, no router hooks) and `cru` (with the routers attached).
  * One timed unit = `lm_eval.simple_evaluate(model=<instance>, ...)` called twice on the same TaskManager:
      a) RWKU: rwku_qa + rwku_mia, target 1, `rwku_items_per_target=K` (greedy 30 tokens; rolling loglik.)
      b) TOFU: tofu_forget10 with `limit=L` (greedy up to 200 tokens + 7 loglikelihoods per item)
    What is timed: the whole simple_evaluate call (task building incl. reading the local data files, request
    construction, the model's requests, metric computation, aggregation; bootstrap_iters=0, log_samples=True),
    measured with time.perf_counter. Also recorded separately: the time spent inside the lm's request
    methods (`generate_until`, `loglikelihood`, `loglikelihood_rolling`, wrapped on the instance), i.e. the
    model part alone.
  * Arms are interleaved and their order is rotated each repeat (hf, cru_base, cru / cru_base, cru, hf / ...),
    --warmup rounds (default 1) are run first and discarded. Medians over repeats and the ratios of the medians are
    printed; the per-repeat paired ratios (cru / hf within the same repeat) are given as well, with their median.
  The issue's goal: <= 5 % wall-time overhead of `cru` (with routers) over `hf`.
  * Equal work. A bundle that forgets changes what the model generates (here: long gibberish instead of a short
    answer ending at EOS), so the `cru` arm generates more tokens than `hf` and its raw wall time mixes the
    routers' cost with a different amount of work. The script therefore also reports, per arm,
      - fixed work: seconds in `loglikelihood` + `loglikelihood_rolling` (the same inputs for every arm), and
      - seconds per decode step of `generate_until` (the model's `_model_generate` is wrapped to count the new
        positions of every generated batch),
    and "equal work": fixed-work seconds + generation seconds rescaled to the `hf` arm's decode steps. The
    headline overhead is the fixed-work ratio: seconds per decode step include the prompt's prefill, so they
    fall as generations get longer and would favour the arm that generates more.

Part 2 (`--full-suites`) -- the protocol runs, `--model cru` without routers:
  * `tofu_forget10_suite` (forget10, retain, real_authors, world_facts; all rows unless --limit; protocol
    decoding) and RWKU target 1's probes (rwku_fb, qa, aa, neighbor_fb, neighbor_qa, mia), each one
    simple_evaluate call with apply_chat_template=True and system_instruction "You are a helpful assistant."
  * Timed: the simple_evaluate call (model constructed before, not timed). With --limit the script also
    prints an ESTIMATE of the full-run time: per request type, time per request in the limited run x the
    number of requests of the full run (+ the non-model remainder scaled by the number of docs). The first
    rows of each task are not necessarily representative (generation lengths vary), so this is an estimate.

Usage:
    python benchmarks/bench_lmeval.py --repeats 5 --json-out results/bench_lmeval.json
    python benchmarks/bench_lmeval.py --skip-overhead --full-suites --limit 4 --dtype bfloat16
    python benchmarks/bench_lmeval.py --skip-overhead --full-suites            # the full protocol runs (long)
    python benchmarks/bench_lmeval.py --device cuda --dtype bfloat16 --model <1-8B HF dir> --repeats 3
    python benchmarks/bench_lmeval.py --device cpu --repeats 1 --warmup 0 --rwku-items 2 --tofu-limit 1  # smoke

The machine may be shared: use --threads and several --repeats; only the paired, interleaved figures are
comparable with each other.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TASK_DIRS = [str(REPO / "tasks" / "tofu"), str(REPO / "tasks" / "rwku")]
SYSTEM_PROMPT = "You are a helpful assistant."
REQUEST_TYPES = ("generate_until", "loglikelihood", "loglikelihood_rolling")
RWKU_PROBES = ["rwku_fb", "rwku_qa", "rwku_aa", "rwku_neighbor_fb", "rwku_neighbor_qa", "rwku_mia"]


# ------------------------------------------------------------------------------------------------ helpers

def _quiet() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore")
    for name in ("lm_eval", "lm-eval", "transformers", "datasets", "cru_harness", "tasks"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import datasets

        datasets.disable_progress_bars()
    except Exception:
        pass


class RequestTimer:
    """Wraps the lm instance's request methods; accumulates seconds and request counts per request type."""

    def __init__(self, lm):
        self.lm = lm
        self.reset()
        for name in REQUEST_TYPES:
            original = getattr(lm, name)  # bound method of the class
            setattr(lm, name, self._wrap(name, original))
        generate = lm._model_generate

        def counted_generate(context, *args, **kwargs):
            out = generate(context, *args, **kwargs)
            self.decode_steps += int(out.shape[1] - context.shape[1])  # new positions of this batch
            return out
        lm._model_generate = counted_generate

    def reset(self) -> None:
        self.seconds = {name: 0.0 for name in REQUEST_TYPES}
        self.count = {name: 0 for name in REQUEST_TYPES}
        self.decode_steps = 0

    @property
    def fixed_work(self) -> float:
        """Seconds in the request types whose work does not depend on the model's outputs."""
        return self.seconds["loglikelihood"] + self.seconds["loglikelihood_rolling"]

    def _wrap(self, name, original):
        def wrapped(requests, *args, **kwargs):
            start = time.perf_counter()
            try:
                return original(requests, *args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.count[name] += len(requests)
        return wrapped

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def _task_manager(data_dir: str, rwku_targets: str, items_per_target: int | None):
    from lm_eval.tasks import TaskManager

    metadata = {"data_dir": data_dir, "rwku_targets": rwku_targets}
    if items_per_target:
        metadata["rwku_items_per_target"] = int(items_per_target)
    return TaskManager(include_path=TASK_DIRS, include_defaults=False, metadata=metadata)


def _evaluate(lm, tasks, task_manager, *, limit=None, chat=False):
    import lm_eval

    kwargs = {}
    if chat:
        kwargs.update(apply_chat_template=True, system_instruction=SYSTEM_PROMPT)
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=task_manager, limit=limit,
                                   log_samples=True, bootstrap_iters=0, verbosity="ERROR", **kwargs)


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def _fmt(xs):
    return "[" + ", ".join(f"{x:.2f}" for x in xs) + "]"


def _pick(results: dict, task: str, metric: str):
    value = results["results"].get(task, {}).get(metric)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


# ------------------------------------------------------------------------------------------------ part 1

def train_bundle(path: str, data_dir: str, out_dir: Path, steps_note: dict, device: str = "cpu") -> Path:
    from cru_harness.cru import RouterTrainingConfig, train_routers
    from cru_harness.data.corpora import load_corpus
    from cru_harness.devices import load_causal_lm

    rwku_dir = str(Path(data_dir) / "rwku")
    model, tokenizer = load_causal_lm(path, device=device, dtype="float32")
    forget = load_corpus("rwku:1:passage", rwku_dir)[:32]
    retain = load_corpus("rwku:2-3:passage", rwku_dir)[::8][:32]
    config = RouterTrainingConfig(last_k=4, percentile=90, lam=1.0, d_r=32, lr=1e-2, input_norm="rms", epochs=5,
                                  batch_size=8, max_length=64, progress=False,
                                  forget_description="rwku:1:passage[:32]",
                                  retain_description="rwku:2-3:passage[::8][:32]")
    start = time.perf_counter()
    bundle = train_routers(model, tokenizer, forget, retain, config)
    seconds = time.perf_counter() - start
    target = out_dir / "routers"
    bundle.save_pretrained(target)
    metrics = bundle.config.metrics
    steps_note.update(train_seconds=seconds, steps=metrics["steps"], blocks=list(bundle.block_indices),
                      forget_gate_mean=metrics["forget_gate_mean"], retain_gate_mean=metrics["retain_gate_mean"],
                      router_parameters=bundle.config.router_parameters)
    del model
    return target


def run_overhead(args, path: str) -> dict:
    import torch
    from lm_eval.models.huggingface import HFLM

    from cru_harness.lmeval.model import CRULM

    out = {"config": {"dtype": args.dtype, "batch_size": args.batch_size, "threads": torch.get_num_threads(),
                      "device": args.device, "repeats": args.repeats, "rwku_items_per_target": args.rwku_items,
                      "tofu_limit": args.tofu_limit, "rwku_tasks": ["rwku_qa", "rwku_mia"],
                      "tofu_tasks": ["tofu_forget10"], "rwku_target": "1", "chat_template": False}}
    tmp = Path(tempfile.mkdtemp(prefix="bench_lmeval_"))
    training: dict = {}
    if args.routers:  # reuse a bundle (e.g. one saved by an earlier run with --keep-bundle)
        from cru_harness.cru.bundle import RouterBundle

        bundle_dir = Path(args.routers)
        saved = RouterBundle.from_pretrained(bundle_dir)
        metrics = saved.config.metrics
        training.update(train_seconds=float("nan"), steps=metrics.get("steps"), blocks=list(saved.block_indices),
                        forget_gate_mean=metrics.get("forget_gate_mean", float("nan")),
                        retain_gate_mean=metrics.get("retain_gate_mean", float("nan")),
                        router_parameters=saved.config.router_parameters)
        del saved
    else:
        print(f"[part 1] training a bundle on {path} ...", flush=True)
        bundle_dir = train_bundle(path, args.data_dir, tmp, training, device=args.device)
        print(f"[part 1] bundle saved to {bundle_dir} (reuse it with --routers)", flush=True)
    out["bundle"] = {**training, "dir": str(bundle_dir)}
    print(f"[part 1] bundle: {training['steps']} steps in {training['train_seconds']:.1f}s, blocks "
          f"{training['blocks']}, gate mean forget {training['forget_gate_mean']:.3f} / retain "
          f"{training['retain_gate_mean']:.3f}, {training['router_parameters']:,} router params", flush=True)

    common = dict(dtype=args.dtype, batch_size=args.batch_size, device=args.device)
    start = time.perf_counter()
    hf = HFLM(pretrained=path, **common)
    cru = CRULM(base=path, routers=str(bundle_dir), **common)
    out["load_seconds_not_timed"] = time.perf_counter() - start
    timers = {"hf": RequestTimer(hf), "cru": RequestTimer(cru)}

    tm = _task_manager(args.data_dir, "1", args.rwku_items)
    arms = ("hf", "cru_base", "cru")

    def run_arm(arm):
        lm = hf if arm == "hf" else cru
        timer = timers["hf" if arm == "hf" else "cru"]
        timer.reset()
        ctx = cru.without_routers() if arm == "cru_base" else _nullcontext()
        figures = {}
        with ctx:
            assert arm != "cru_base" or not cru.has_routers
            assert arm != "cru" or cru.has_routers
            t0 = time.perf_counter()
            res_rwku = _evaluate(lm, ["rwku_qa", "rwku_mia"], tm)
            t1 = time.perf_counter()
            model_rwku = timer.total
            res_tofu = _evaluate(lm, ["tofu_forget10"], tm, limit=args.tofu_limit)
            t2 = time.perf_counter()
        figures.update(wall_rwku=t1 - t0, wall_tofu=t2 - t1, wall=t2 - t0,
                       model_rwku=model_rwku, model_tofu=timer.total - model_rwku, model=timer.total,
                       fixed_work=timer.fixed_work, generate=timer.seconds["generate_until"],
                       decode_steps=timer.decode_steps,
                       s_per_decode_step=timer.seconds["generate_until"] / max(1, timer.decode_steps),
                       requests=dict(timer.count), request_seconds=dict(timer.seconds))
        figures["scores"] = {
            "rwku_qa rouge_l_recall": _pick(res_rwku, "rwku_qa", "rouge_l_recall,none"),
            "rwku_mia fm_loss": _pick(res_rwku, "rwku_mia", "fm_loss,none"),
            "tofu_forget10 rouge_l_recall": _pick(res_tofu, "tofu_forget10", "rouge_l_recall,none"),
            "tofu_forget10 probability": _pick(res_tofu, "tofu_forget10", "probability,none"),
        }
        figures["generations"] = ([s["filtered_resps"][0] for s in res_rwku["samples"]["rwku_qa"]]
                                  + [s["filtered_resps"][0] for s in res_tofu["samples"]["tofu_forget10"]])
        return figures

    out["config"]["warmup_rounds"] = args.warmup
    for _ in range(args.warmup):
        print("[part 1] warm-up round (discarded) ...", flush=True)
        for arm in arms:
            run_arm(arm)
    runs = {arm: [] for arm in arms}
    for rep in range(args.repeats):
        order = arms[rep % 3:] + arms[:rep % 3]
        for arm in order:
            fig = run_arm(arm)
            runs[arm].append(fig)
            print(f"[part 1] repeat {rep + 1}/{args.repeats} {arm:8s} wall {fig['wall']:.2f}s "
                  f"(rwku {fig['wall_rwku']:.2f} + tofu {fig['wall_tofu']:.2f}), in model {fig['model']:.2f}s",
                  flush=True)

    out["requests_per_unit"] = {arm: runs[arm][0]["requests"] for arm in arms}
    out["decode_steps_per_unit"] = {arm: runs[arm][0]["decode_steps"] for arm in arms}
    hf_steps = statistics.median(r["decode_steps"] for r in runs["hf"])
    for arm in arms:  # equal work: generation time rescaled to the hf arm's decode steps
        for r in runs[arm]:
            r["equal_work"] = r["fixed_work"] + r["s_per_decode_step"] * hf_steps
    keys = ("wall", "wall_rwku", "wall_tofu", "model", "model_rwku", "model_tofu", "fixed_work",
            "s_per_decode_step", "equal_work")
    out["per_repeat"] = {arm: {k: [r[k] for r in runs[arm]] for k in keys} for arm in arms}
    out["per_repeat_request_seconds"] = {arm: [r["request_seconds"] for r in runs[arm]] for arm in arms}
    out["median"] = {arm: {k: _median(out["per_repeat"][arm][k]) for k in keys} for arm in arms}
    out["ratio_of_medians"] = {f"{arm}/hf": {k: out["median"][arm][k] / out["median"]["hf"][k] for k in keys}
                               for arm in ("cru_base", "cru")}
    out["ratio_of_medians"]["cru/cru_base"] = {k: out["median"]["cru"][k] / out["median"]["cru_base"][k]
                                               for k in keys}
    paired = {}
    for arm in ("cru_base", "cru"):
        paired[f"{arm}/hf"] = {k: [a[k] / b[k] for a, b in zip(runs[arm], runs["hf"])] for k in keys}
    paired["cru/cru_base"] = {k: [a[k] / b[k] for a, b in zip(runs["cru"], runs["cru_base"])] for k in keys}
    out["paired_ratios"] = paired
    out["paired_ratio_median"] = {name: {k: _median(v) for k, v in d.items()} for name, d in paired.items()}
    out["scores"] = {arm: runs[arm][-1]["scores"] for arm in arms}
    out["generations_equal_hf_vs_cru_base"] = runs["hf"][-1]["generations"] == runs["cru_base"][-1]["generations"]
    out["generations_changed_by_routers"] = sum(
        a != b for a, b in zip(runs["cru_base"][-1]["generations"], runs["cru"][-1]["generations"]))
    out["n_generations"] = len(runs["cru"][-1]["generations"])
    # The issue's figure: `cru` with the bundle over `hf` on equal work (goal <= 1.05).
    out["headline"] = {"cru_with_bundle_over_hf_equal_work": out["ratio_of_medians"]["cru/hf"]["equal_work"],
                       "cru_with_bundle_over_hf_fixed_work": out["ratio_of_medians"]["cru/hf"]["fixed_work"],
                       "goal": 1.05}
    _print_overhead(out)
    return out


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _print_overhead(out: dict) -> None:
    cfg = out["config"]
    print("\n=== Part 1: cru vs hf, same base, same tasks, same process ===")
    print(f"dtype {cfg['dtype']}, batch {cfg['batch_size']}, torch threads {cfg['threads']}, {cfg['repeats']} "
          f"interleaved repeats (+{cfg['warmup_rounds']} warm-up rounds discarded); unit = simple_evaluate(rwku_qa+rwku_mia, target 1, "
          f"{cfg['rwku_items_per_target']} items/probe-file) + simple_evaluate(tofu_forget10, limit "
          f"{cfg['tofu_limit']}); model loading not timed ({out['load_seconds_not_timed']:.1f}s for both)")
    print(f"requests per unit: {out['requests_per_unit']['hf']}")
    for arm in ("hf", "cru_base", "cru"):
        pr = out["per_repeat"][arm]
        print(f"  {arm:8s} wall {_fmt(pr['wall'])} median {out['median'][arm]['wall']:.2f}s | "
              f"in model {_fmt(pr['model'])} median {out['median'][arm]['model']:.2f}s")
    for name in ("cru_base/hf", "cru/hf", "cru/cru_base"):
        rm, pm = out["ratio_of_medians"][name], out["paired_ratio_median"][name]
        print(f"  {name:13s} ratio of medians: wall {rm['wall']:.3f} (rwku {rm['wall_rwku']:.3f}, tofu "
              f"{rm['wall_tofu']:.3f}), in-model {rm['model']:.3f} | median of paired ratios: wall "
              f"{pm['wall']:.3f}, in-model {pm['model']:.3f}; paired wall ratios {_fmt(out['paired_ratios'][name]['wall'])}")
    steps = out["decode_steps_per_unit"]
    print(f"  decode steps per unit: hf {steps['hf']}, cru_base {steps['cru_base']}, cru {steps['cru']} "
          "(routers change what is generated, so the raw wall times above are not equal work)")
    for name in ("cru_base/hf", "cru/hf", "cru/cru_base"):
        rm, pm = out["ratio_of_medians"][name], out["paired_ratio_median"][name]
        print(f"  {name:13s} equal work {rm['equal_work']:.3f} (paired median {pm['equal_work']:.3f}, per repeat "
              f"{_fmt(out['paired_ratios'][name]['equal_work'])}) | fixed work (loglik.) {rm['fixed_work']:.3f} | "
              f"s per decode step {rm['s_per_decode_step']:.3f}")
    overhead = 100 * (out["ratio_of_medians"]["cru/hf"]["fixed_work"] - 1)
    equal = 100 * (out["ratio_of_medians"]["cru/hf"]["equal_work"] - 1)
    raw = 100 * (out["ratio_of_medians"]["cru/hf"]["wall"] - 1)
    print(f"  => cru (with routers) overhead over hf on fixed work (log-likelihood requests, identical inputs): "
          f"{overhead:+.1f} % (goal <= 5 %); at equal work incl. generation: {equal:+.1f} % (per-step time falls "
          f"as generations grow longer, since the prompt's prefill is spread over more steps: favours the arm that "
          f"generates more); raw wall time incl. the longer generations: {raw:+.1f} %")
    print(f"  sanity: hf and cru_base generations identical: {out['generations_equal_hf_vs_cru_base']}; "
          f"routers changed {out['generations_changed_by_routers']}/{out['n_generations']} generations")
    for arm in ("hf", "cru_base", "cru"):
        print(f"  scores {arm:8s} {out['scores'][arm]}")


# ------------------------------------------------------------------------------------------------ part 2

def _requests_per_doc(samples: list, task: str) -> dict:
    """Mean number of requests of each type per doc, from the logged samples of one task."""
    counts = {name: 0 for name in REQUEST_TYPES}
    for s in samples:
        n = len(s["arguments"])
        if task.startswith("tofu_"):
            counts["generate_until"] += 1
            counts["loglikelihood"] += n - 1
        elif task.endswith("_mia"):
            counts["loglikelihood_rolling"] += n
        else:
            counts["generate_until"] += n
    return {k: v / max(1, len(samples)) for k, v in counts.items()}


def _full_doc_counts(tm, tasks) -> dict:
    from lm_eval.tasks import get_task_dict

    counts = {}

    def walk(d):
        for name, value in d.items():
            if isinstance(value, dict):
                walk(value)
            else:
                counts[value.config.task] = len(list(value.eval_docs))

    walk(get_task_dict(tasks, tm))
    return counts


def run_full_suites(args, path: str, save=lambda partial: None) -> dict:
    import torch

    from cru_harness.lmeval.model import CRULM

    chat = not args.no_chat_template
    start = time.perf_counter()
    lm = CRULM(base=path, dtype=args.dtype, batch_size=args.batch_size, device=args.device)
    load = time.perf_counter() - start
    timer = RequestTimer(lm)
    out = {"config": {"dtype": args.dtype, "batch_size": args.batch_size, "threads": torch.get_num_threads(),
                      "limit": args.limit, "chat_template": chat,
                      "system_instruction": SYSTEM_PROMPT if chat else None, "routers": None},
           "load_seconds_not_timed": load, "runs": {}}
    print(f"\n=== Part 2: protocol runs, --model cru without routers, dtype {args.dtype}, batch "
          f"{args.batch_size}, chat template {chat}, limit {args.limit} ===", flush=True)
    full_tm = _task_manager(args.data_dir, "1", None)
    # RWKU first: it is the shorter run, so a long TOFU run cut short still leaves one finished figure
    for label, tasks in (("rwku_target1_probes", RWKU_PROBES), ("tofu_forget10_suite", ["tofu_forget10_suite"])):
        timer.reset()
        t0 = time.perf_counter()
        if label.startswith("rwku") and args.limit is not None:
            # RWKU: the first N rows of each file of the target (so MIA keeps both FM and RM rows; lm-eval's
            # limit would keep the first N MIA docs, all FM, and leave RM / AUC NaN)
            res = _evaluate(lm, tasks, _task_manager(args.data_dir, "1", args.limit), chat=chat)
        else:
            res = _evaluate(lm, tasks, full_tm, limit=args.limit, chat=chat)
        wall = time.perf_counter() - t0
        docs_run = {task: len(samples) for task, samples in res["samples"].items()}
        full_docs = _full_doc_counts(full_tm, tasks)
        entry = {"wall_seconds": wall, "model_seconds": timer.total, "request_seconds": dict(timer.seconds),
                 "requests": dict(timer.count), "docs_run": docs_run, "docs_full": full_docs}
        metrics = {}
        for task, r in res["results"].items():
            metrics[task] = {k: v for k, v in r.items() if isinstance(v, (int, float)) and not k.endswith("stderr,none")
                             and k != "sample_len" and "alias" not in k}
        entry["metrics"] = metrics
        if args.limit is not None:
            full_requests = {name: 0.0 for name in REQUEST_TYPES}
            for task, samples in res["samples"].items():
                per_doc = _requests_per_doc(samples, task)
                for name in REQUEST_TYPES:
                    full_requests[name] += per_doc[name] * full_docs.get(task, len(samples))
            estimate = 0.0
            for name in REQUEST_TYPES:
                if timer.count[name]:
                    estimate += timer.seconds[name] / timer.count[name] * full_requests[name]
            doc_scale = sum(full_docs.values()) / max(1, sum(docs_run.values()))
            estimate += (wall - timer.total) * doc_scale
            entry["full_requests"] = {k: round(v) for k, v in full_requests.items()}
            entry["ESTIMATED_full_wall_seconds"] = estimate
        out["runs"][label] = entry
        save(out)  # written after each run, so a run cut short keeps the finished figures
        print(f"[part 2] {label}: {wall:.1f}s wall ({timer.total:.1f}s in model: "
              + ", ".join(f"{timer.count[n]} {n} {timer.seconds[n]:.1f}s" for n in REQUEST_TYPES if timer.count[n])
              + f"), docs {docs_run}", flush=True)
        if args.limit is not None:
            print(f"[part 2] {label}: ESTIMATE for all rows ({sum(full_docs.values())} docs, requests "
                  f"{entry['full_requests']}): ~{entry['ESTIMATED_full_wall_seconds'] / 60:.1f} min "
                  f"(extrapolated from the first {args.limit} rows per task)", flush=True)
        for task, m in metrics.items():
            print(f"          {task}: " + ", ".join(f"{k.split(',')[0]}={v:.4g}" for k, v in m.items()))
    return out


# ------------------------------------------------------------------------------------------------ main

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--data-dir", default=os.environ.get("CRU_HARNESS_DATA_DIR", str(REPO.parent / "shared" / "data")),
                        help="root holding tofu/ and rwku/ (default: ../shared/data next to the repo)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N (cru_harness.devices)")
    parser.add_argument("--model", default=None, help="HF model directory or id (default: the offline SmolLM2)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=5, help="part 1: interleaved repeats per arm")
    parser.add_argument("--rwku-items", type=int, default=8,
                        help="part 1: rwku_items_per_target (first N rows of each RWKU file of target 1)")
    parser.add_argument("--routers", default=None,
                        help="part 1: an existing bundle dir for SmolLM2 instead of training one")
    parser.add_argument("--tofu-limit", type=int, default=8, help="part 1: limit of tofu_forget10")
    parser.add_argument("--warmup", type=int, default=1, help="part 1: discarded warm-up rounds (all arms)")
    parser.add_argument("--skip-overhead", action="store_true", help="do not run part 1")
    parser.add_argument("--full-suites", action="store_true", help="run part 2")
    parser.add_argument("--limit", type=int, default=None,
                        help="part 2: first N rows of every TOFU task / of every RWKU file (rwku_items_per_target)")
    parser.add_argument("--no-chat-template", action="store_true", help="part 2: plain prompts")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)

    _quiet()
    import torch

    from cru_harness.devices import DeviceError, check_dtype_on_device, parse_dtype, resolve_device

    try:  # a GPU that is not there: one clear line, before any work
        device = resolve_device(args.device)
        check_dtype_on_device(parse_dtype(args.dtype), device)
    except DeviceError as err:
        parser.error(str(err))
    args.device = str(device)
    if device.type == "cuda" and args.json_out is None:   # on the lent GPU machine only $OUT comes back
        args.json_out = str(Path(os.environ["OUT"]) / "lmeval_overhead_gpu.json" if os.environ.get("OUT")
                            else REPO / "benchmarks" / "results" / "lmeval_overhead_gpu.json")
    if args.threads:
        torch.set_num_threads(args.threads)
    from cru_harness.lmeval.registration import register
    from cru_harness.testbed.smollm import materialize_smollm2

    register()
    path = args.model or str(materialize_smollm2())
    report = {"model": args.model or "SmolLM2-135M-Instruct", "path": path, "torch": torch.__version__,
              "cuda": torch.version.cuda, "device": args.device,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "python": sys.version.split()[0], "cpu_count": os.cpu_count(),
              "loadavg_at_start": list(os.getloadavg())}
    try:
        import lm_eval

        report["lm_eval"] = getattr(lm_eval, "__version__", None)
    except Exception:
        pass
    if not args.skip_overhead:
        report["overhead"] = run_overhead(args, path)

    def save(partial=None):
        if partial is not None:
            report["full_suites"] = partial
        report["loadavg_at_end"] = list(os.getloadavg())
        if args.json_out:
            from cru_harness.store import atomic_write_text

            atomic_write_text(args.json_out, json.dumps(report, indent=2, default=str))

    save()
    if args.full_suites:
        report["full_suites"] = run_full_suites(args, path, save)
    save()
    if args.json_out:
        print(f"\nwrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
