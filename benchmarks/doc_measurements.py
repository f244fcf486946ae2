"""Measured figures the docs quote, recomputed here with the package's own public code.

Three figures in docs/ had no committed source; each is measured the way the package computes it:

1. RWKU passages (docs/cru_method.md, "Phase 2" defaults): the `rwku:all:passage` corpus as CRU's training reads it
   (`data.load_corpus`, every target of the data directory), each passage encoded as `cru.localize.tokenize_texts`
   encodes a training text (`prompts.encode_text`: the tokenizer's special tokens unless the text starts with its
   BOS; SmolLM2's tokenizer adds none, which is checked) without the cut, by SmolLM2-135M-Instruct's tokenizer
   (the offline `smollm2` of `runner.models`). Counted: passages longer than 256 tokens (exactly those
   `tokenize_texts(..., 256)` truncates, which is checked too) and longer than 512 (the baselines' length).

2. Gates of freshly initialised routers (docs/cru_method.md, "Options beyond the paper", `router_init`;
   docs/findings.md, router_init). The CRU cell of configs/cpu_smollm2.yaml, seed 0, on its base: SmolLM2
   fine-tuned by that config's finetune cell (`runner.training.train_finetuned_model`, the runner's own call,
   cached under --cache-dir; --model reuses a checkpoint). The routers are the state `cru.train.train_routers`
   would take its first step from: `train_routers` itself runs with `RouterTrainer.train` replaced by a no-op
   (0 steps; the API refuses epochs 0), and its bundle is checked bit for bit against `cru.localize.localize` +
   `cru.train.new_bundle` called directly. Measured on the cell's forget corpus (`forget01[:20]`, written by
   `runner.prompting.prompt_format` as the runner writes it) and, beside it, its retain corpus: per gated block,
   the share of gate values (non-padding token x selected coordinate) below 0.05 and above 0.95, and the share
   of selected coordinates whose gate is below 0.05 (above 0.95) on every token. Gates are read by the package's
   own measurement, `cru.train.measure_gate_means` (the texts tokenized as training tokenizes them), with a
   `GateShares` recorder (a `GateRecorder` that also counts shares).

3. The scored span of a TOFU chat request (docs/protocol.md, "scored span (chat)"). The released SmolLM2 (not
   fine-tuned), the first 40 docs of the `tofu_real_authors` task (chat template, default presets, no system
   instruction: the runner's evaluation). The task's requests are captured from `lm_eval.simple_evaluate` with the
   `cru` model (generation cut to 1 new token: it is not measured). Compared, on the same lm-eval context (the
   rendered prompt, ending in the assistant header's `\\n`):
   - project span: the task's request `(ctx, JOINT_MARKER + rest of the finished conversation + EOS_MARKER)`
     scored by `cru` (`CRULM.encode_request`, joint branch), exactly what the cell scores;
   - lm-eval's span + EOS: `(ctx, answer + EOS_MARKER)` scored by `cru` without JOINT_MARKER, i.e. HFLM's own
     `_encode_pair` (which moves the context's trailing `\\n` into the continuation) plus the EOS id;
   - lm-eval's `hf` model on `(ctx, answer)`: HFLM's loglikelihood, unchanged (no EOS); its log-prob sum is checked
     against the span above less its EOS token. (`hf` run on the task itself would score the markers as literal
     text: the task reports NaN for it, so that is not a span anyone reads.)
   Per item: the number of scored tokens and exp(-mean token NLL) (`metrics.probability_from_avg_nll`, TOFU's
   per-token normalised probability); reported as means over the 40 answers, and over all 160 scored
   continuations (answer + 3 perturbed answers) beside them.

Not measured: docs/protocol.md's regex sentence splitter vs nltk's punkt (0.003 bits on 300 RWKU passages) needs
nltk's punkt data, which cannot be downloaded on this offline machine.

    OMP_NUM_THREADS=1 python benchmarks/doc_measurements.py --data-dir ../shared/data \\
        --out benchmarks/results/doc_measurements.md [--model /tmp/doc_meas/<hash>/finetuned_model]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from unittest.mock import patch

import numpy as np
import torch

from cru_harness import metrics as M
from cru_harness.cru.localize import localize, tokenize_texts
from cru_harness.cru.train import (GateRecorder, RouterTrainer, RouterTrainingConfig, StepResult,
                                   measure_gate_means, new_bundle, train_routers)
from cru_harness.context import fit_to_context
from cru_harness.data.corpora import load_corpus
from cru_harness.benchmarks.rwku.data import list_targets
from cru_harness.prompts import adds_special_tokens, encode_text
from cru_harness.runner.config import load_config
from cru_harness.runner.prompting import protocol_presets, use_chat_template
from cru_harness.runner.models import load_model, resolve_model_path
from cru_harness.runner.plan import build_plan, finetune_cell_for
from cru_harness.runner.prompting import prompt_format
from cru_harness.runner.training import train_finetuned_model

PARTS = ("rwku", "gates", "span")
LOW, HIGH = 0.05, 0.95


def pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f} %"


def verdict(ok: bool) -> str:
    return "**matches**" if ok else "**differs**"


# ------------------------------------------------------------------------------------------------- 1. RWKU


def measure_rwku(data_dir: str) -> list[str]:
    from transformers import AutoTokenizer

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2"))
    n_targets = len(list_targets(data_dir))
    texts = load_corpus("rwku:all:passage", data_dir, tokenizer=tokenizer, benchmark="rwku")
    lengths = np.array([len(encode_text(tokenizer, text)) for text in texts])
    plain = np.array([len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts])
    special = sum(adds_special_tokens(tokenizer, text) for text in texts)
    cut = tokenize_texts(tokenizer, texts, 256)
    truncated = sum(len(ids) < n for ids, n in zip(cut, lengths))
    over256, over512 = float((lengths > 256).mean()), float((lengths > 512).mean())
    ok = len(texts) == 12798 and n_targets == 200 and round(100 * over256, 1) == 16.5 and \
        round(100 * over512, 1) == 4.3
    return [
        "## 1. RWKU passages longer than CRU's 256 tokens", "",
        "docs/cru_method.md (Phase 2 defaults): \"of RWKU's 12,798 passages (200 targets) 16.5 % exceed 256 SmolLM2 "
        "tokens and 4.3 % exceed 512\".", "",
        f"Counted: `load_corpus(\"rwku:all:passage\", data_dir, tokenizer=SmolLM2's, benchmark=\"rwku\")` (passage rows "
        f"are `text` rows: the text as stored), each encoded by `prompts.encode_text` without a cut, the encoding of "
        f"`cru.localize.tokenize_texts` that `train_routers` applies with `max_length=256`. `encode_text` asked for "
        f"special tokens on {special} of {len(texts)} passages, and SmolLM2's tokenizer adds none: lengths without "
        f"special tokens are {'identical' if (plain == lengths).all() else 'DIFFERENT'}. "
        f"`tokenize_texts(..., 256)` truncated {truncated} passages, the same number as exceed 256.", "",
        "| | doc | measured |", "|---|---|---|",
        f"| targets | 200 | {n_targets} |",
        f"| passages | 12,798 | {len(texts):,} |",
        f"| > 256 tokens | 16.5 % | {pct(over256)} ({int((lengths > 256).sum())} passages, {over256:.5f}) |",
        f"| > 512 tokens | 4.3 % | {pct(over512)} ({int((lengths > 512).sum())} passages, {over512:.5f}) |",
        f"| tokens per passage (mean / median / max) | – | {lengths.mean():.1f} / {np.median(lengths):.0f} / "
        f"{lengths.max()} |", "",
        f"Verdict: {verdict(ok)}. ({time.perf_counter() - started:.0f} s)", ""]


# ------------------------------------------------------------------------------------------------ 2. gates


class GateShares(GateRecorder):
    """A `GateRecorder` that also keeps, per block, how many of each non-padding token's gates (one per selected
    coordinate) are below LOW / above HIGH, and each coordinate's min and max gate over those tokens. Tokens come
    in the same order for every block of a pass (the same mask), so per-token counts add up across blocks."""

    def __init__(self):
        super().__init__()
        self.low, self.high = {}, {}                  # block -> [per-token counts of one pass, ...]
        self.coord_min, self.coord_max = {}, {}
        self.total_sum, self.total_count = {}, {}     # block -> gate sum / count over every pass

    def __call__(self, block, bundle, gates):
        super().__call__(block, bundle, gates)
        self.total_sum[block] = self.total_sum.get(block, 0.0) + float(self.sums[block])
        self.total_count[block] = self.total_count.get(block, 0.0) + self.counts[block]
        real = gates.detach()[self.mask.to(gates.device).bool()]   # (tokens, |C|)
        self.low.setdefault(block, []).append((real < LOW).sum(dim=1))
        self.high.setdefault(block, []).append((real > HIGH).sum(dim=1))
        low, high = real.min(dim=0).values, real.max(dim=0).values
        self.coord_min[block] = low if block not in self.coord_min else torch.minimum(self.coord_min[block], low)
        self.coord_max[block] = high if block not in self.coord_max else torch.maximum(self.coord_max[block], high)


def share_stats(low: torch.Tensor, high: torch.Tensor, width: int) -> dict:
    """Shares from per-token counts out of `width` gates per token: over all values, and min / max over tokens."""
    low, high = low.double() / width, high.double() / width
    return {"low": float(low.mean()), "high": float(high.mean()), "tokens": int(low.numel()),
            "low_min": float(low.min()), "low_max": float(low.max()),
            "high_min": float(high.min()), "high_max": float(high.max())}


def gate_shares(model, tokenizer, bundle, texts, batch_size, max_length) -> dict:
    """Per gated block (and pooled over blocks 26-28 and over all gated blocks): the shares of `share_stats`, the
    mean gate, and the shares of coordinates below LOW / above HIGH on every token; read by the package's own
    measurement (`cru.train.measure_gate_means`) with a `GateShares` recorder."""
    recorder = GateShares()
    measure_gate_means(model, tokenizer, bundle, texts, batch_size=batch_size, max_length=max_length,
                       recorder=recorder)
    sums, counts = recorder.total_sum, recorder.total_count
    low = {b: torch.cat(recorder.low[b]) for b in bundle.block_indices}
    high = {b: torch.cat(recorder.high[b]) for b in bundle.block_indices}
    width = {b: int(recorder.coord_min[b].numel()) for b in bundle.block_indices}
    out = {}
    for b in bundle.block_indices:
        out[str(b)] = {**share_stats(low[b], high[b], width[b]), "mean": sums[b] / counts[b], "coords": width[b],
                       "coords_low_always": float((recorder.coord_max[b] < LOW).float().mean()),
                       "coords_high_always": float((recorder.coord_min[b] > HIGH).float().mean())}
    groups = {"26–28": [b for b in bundle.block_indices if 26 <= b <= 28], "all gated": list(bundle.block_indices)}
    for name, blocks in groups.items():
        if blocks:
            out[name] = {**share_stats(sum(low[b] for b in blocks), sum(high[b] for b in blocks),
                                       sum(width[b] for b in blocks)),
                         "mean": sum(sums[b] for b in blocks) / sum(counts[b] for b in blocks),
                         "coords": sum(width[b] for b in blocks),
                         "coords_low_always": sum(float((recorder.coord_max[b] < LOW).sum()) for b in blocks)
                         / sum(width[b] for b in blocks),
                         "coords_high_always": sum(float((recorder.coord_min[b] > HIGH).sum()) for b in blocks)
                         / sum(width[b] for b in blocks)}
    return out


def same_bundle(a, b) -> bool:
    if a.block_indices != b.block_indices or a.config.neurons != b.config.neurons:
        return False
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def measure_gates(args, data_dir: str) -> list[str]:
    started = time.perf_counter()
    cells = build_plan(load_config(args.config))
    cru = next(c for c in cells if c.method == "CRU" and c.seed == 0)
    ft = finetune_cell_for(cru, cells)
    notes = []
    if args.model:
        model_path = str(args.model)
        notes.append(f"Base: `{model_path}` (given with --model; fine-tuned earlier by this script's own call, "
                     f"see its `finetune_outcome.json` beside it if present).")
        record = Path(model_path).parent / "finetune_outcome.json"
    else:
        workdir = args.cache_dir / ft.hash
        outcome = {"resources": {}, "details": {}, "artifacts": {}}
        t0 = time.perf_counter()
        model_path = train_finetuned_model(ft, ft.extra.get("finetune", ft.hparams),
                                           resolve_model_path(ft.model.path), ft.corpora["train_corpus"], workdir,
                                           data_dir, outcome)
        record = workdir / "finetune_outcome.json"
        record.write_text(json.dumps(outcome, indent=1, default=str) + "\n")
        notes.append(f"Base: fine-tuned here by `runner.training.train_finetuned_model` for finetune cell "
                     f"{ft.hash} ({time.perf_counter() - t0:.0f} s), saved at `{model_path}`.")
    if record.is_file():
        final = json.loads(record.read_text())["details"]["finetune"]["final_logs"]
        committed = Path("results") / "cpu_smollm2" / "cells" / ft.hash / "result.json"
        if committed.is_file():
            then = json.loads(committed.read_text())["details"]["finetune"]["final_logs"]
            notes.append(f"Fine-tune's final loss {final['loss']!r} (step {final['step']}); the committed cell "
                         f"{ft.hash} (results/cpu_smollm2) ended at {then['loss']!r} (step {then['step']}): "
                         f"{'identical' if final['loss'] == then['loss'] else 'different'}.")
    torch.manual_seed(0)
    model, tokenizer = load_model(model_path, cru)
    fmt = prompt_format(cru, use_chat_template(cru, model_path))
    forget = load_corpus(cru.corpora["forget_corpus"], data_dir, tokenizer=tokenizer, **fmt)
    retain = load_corpus(cru.corpora["retain_corpus"], data_dir, tokenizer=tokenizer, **fmt)
    config = RouterTrainingConfig(**cru.hparams, seed=cru.seed or 0, progress=False,
                                  forget_description=cru.corpora["forget_corpus"],
                                  retain_description=cru.corpora["retain_corpus"])

    def no_steps(self):   # RouterTrainer.train with its schedule left out: the routers stay as initialised
        self.prepare()
        return StepResult(math.nan, math.nan, math.nan)

    with patch.object(RouterTrainer, "train", no_steps):
        bundle = train_routers(model, tokenizer, forget, retain, config)
    max_length = fit_to_context(model, config.max_length, lambda: {})
    direct = new_bundle(model, localize(model, tokenizer, forget, blocks=config.blocks, last_k=config.last_k,
                                        percentile=config.percentile, selection=config.selection, seed=config.seed,
                                        batch_size=config.batch_size, max_length=max_length,
                                        site=config.gate_site,
                                        exclude_top_magnitude=config.exclude_top_magnitude), config)
    identical = same_bundle(bundle, direct)
    shares = {side: gate_shares(model, tokenizer, bundle, texts, config.batch_size, max_length)
              for side, texts in (("forget", forget), ("retain", retain))}
    metrics = bundle.config.metrics
    lines = [
        "## 2. Gates of freshly initialised routers (PyTorch default init) on the fine-tuned SmolLM2", "",
        "docs/cru_method.md (`router_init`): \"Routers reading SmolLM2's raw residual stream start there with "
        "20–36 % of their gate values below 0.05 and 22–33 % above 0.95 per block (blocks 26–28, fine-tuned on TOFU, "
        "seed 0; each token has 13–49 % of its gates below 0.05 ...)\". Before this measurement the docs said "
        "\"22–42 % of their gates below 0.05 and 23–33 % above 0.95 on every token\", from an uncommitted count "
        "that no reading below bears out (no coordinate is below 0.05, or above 0.95, on every token).", "",
        *notes, "",
        f"CRU cell {cru.hash} of `{args.config}` ({cru.describe()}): hparams {cru.hparams}, "
        f"`RouterTrainingConfig` {{router_init: {config.router_init!r}, input_norm: {config.input_norm!r}, "
        f"seed: {config.seed}, max_length: {max_length}}}; forget corpus `{cru.corpora['forget_corpus']}` "
        f"({len(forget)} texts), retain `{cru.corpora['retain_corpus']}` ({len(retain)}), written with {fmt}. "
        f"Routers: `train_routers` with 0 steps; bit-identical to `localize` + `new_bundle` called directly: "
        f"{'yes' if identical else 'NO'}. Its own final measurement of them (eval mode) gives gate means forget "
        f"{metrics['forget_gate_mean']:.4f} / retain {metrics['retain_gate_mean']:.4f}.", "",
        "Columns: \"values\" = all gate values (non-padding token x selected coordinate); \"per token\" = each "
        "token's share of its gates (one per selected coordinate of the block or blocks), its minimum and maximum "
        "over the corpus's tokens; \"coords on every token\" = selected coordinates whose gate is below 0.05 "
        "(above 0.95) on every token. Rows 26–28 and \"all gated\" pool the blocks' coordinates per token.", "",
        "| corpus | block | coords | tokens | mean gate | values < 0.05 | values > 0.95 | per token < 0.05 "
        "(min–max) | per token > 0.95 (min–max) | coords < 0.05 on every token | coords > 0.95 on every token |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for side, per_block in shares.items():
        for b, s in per_block.items():
            lines.append(f"| {side} | {b} | {s['coords']} | {s['tokens']} | {s['mean']:.4f} | "
                         f"{pct(s['low'], 0)} ({s['low']:.4f}) | {pct(s['high'], 0)} ({s['high']:.4f}) | "
                         f"{pct(s['low_min'], 0)}–{pct(s['low_max'], 0)} ({s['low_min']:.4f}–{s['low_max']:.4f}) | "
                         f"{pct(s['high_min'], 0)}–{pct(s['high_max'], 0)} "
                         f"({s['high_min']:.4f}–{s['high_max']:.4f}) | "
                         f"{pct(s['coords_low_always'], 0)} ({s['coords_low_always']:.4f}) | "
                         f"{pct(s['coords_high_always'], 0)} ({s['coords_high_always']:.4f}) |")
    forget = shares["forget"]
    doc_blocks = [b for b in forget if b.isdigit() and 26 <= int(b) <= 28]

    def across(key):   # the range of a per-block value over blocks 26-28, rounded as the doc rounds
        values = [forget[b][key] for b in doc_blocks]
        return round(100 * min(values)), round(100 * max(values))

    def show(pair):
        return f"{pair[0]}–{pair[1]} %"

    value_low, value_high = across("low"), across("high")
    pooled = forget.get("26–28", {})
    token_low = (round(100 * pooled["low_min"]), round(100 * pooled["low_max"])) if pooled else None
    token_high = (round(100 * pooled["high_min"]), round(100 * pooled["high_max"])) if pooled else None
    coord_low, coord_high = across("coords_low_always"), across("coords_high_always")
    doc_low, doc_high, doc_token_low = (20, 36), (22, 33), (13, 49)
    lines += ["", "Forget corpus, blocks 26–28, against the doc:", "",
              f"- share of gate values per block, range over the three blocks: {show(value_low)} / "
              f"{show(value_high)} (doc: 20–36 % / 22–33 %): "
              f"{verdict(value_low == doc_low and value_high == doc_high)};",
              f"- share of each token's gates below 0.05 (the three blocks pooled), range over tokens: "
              f"{show(token_low)} (doc: 13–49 %): {verdict(token_low == doc_token_low)}; above 0.95: "
              f"{show(token_high)};",
              f"- share of coordinates below / above on every token, range over the three blocks: {show(coord_low)} / "
              f"{show(coord_high)} (the earlier claim's reading).", "",
              f"({time.perf_counter() - started:.0f} s)", ""]
    del model
    return lines


# ------------------------------------------------------------------------------------------------- 3. span


def measure_span(args, data_dir: str) -> list[str]:
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from cru_harness.lmeval.model import CRULM
    from cru_harness.protocol import EOS_MARKER, JOINT_MARKER
    from cru_harness.lmeval.registration import tasks_dir

    started = time.perf_counter()
    base = resolve_model_path("smollm2")
    cru = CRULM(base=base, device="cpu", batch_size=8)
    captured = []
    loglikelihood = cru.loglikelihood

    def capture(requests, disable_tqdm=False):
        results = loglikelihood(requests, disable_tqdm=disable_tqdm)
        captured.extend(zip(requests, results))
        return results

    cru.loglikelihood = capture
    metadata = {k: v for k, v in protocol_presets({}).items() if v is not None} | {"data_dir": str(data_dir)}
    evaluated = lm_eval.simple_evaluate(
        model=cru, tasks=["tofu_real_authors"], limit=args.span_items, apply_chat_template=True, log_samples=True,
        task_manager=TaskManager(include_path=tasks_dir(), include_defaults=False, metadata=metadata),
        gen_kwargs={"max_gen_toks": 1}, bootstrap_iters=0)
    cru.loglikelihood = loglikelihood
    from cru_harness.benchmarks.tofu.tasks.utils import scored_continuations

    captured.sort(key=lambda pair: (pair[0].doc_id, pair[0].idx))
    texts = [scored_continuations("mc", req.doc)[req.idx - 1] for req, _ in captured]
    plain = [dataclasses.replace(req, arguments=(req.args[0], text + EOS_MARKER), resps=[], filtered_resps={})
             for (req, _), text in zip(captured, texts)]
    bare = [dataclasses.replace(req, arguments=(req.args[0], text), resps=[], filtered_resps={})
            for (req, _), text in zip(captured, texts)]
    plain_results = cru.loglikelihood(plain)
    hf = HFLM(pretrained=base, device="cpu", batch_size=8)
    hf_results = hf.loglikelihood(bare)
    hf_lengths = [len(hf._encode_pair(req.args[0], req.args[1])[1]) for req in bare]

    def prob(logprobs):
        return float(M.probability_from_avg_nll(M.avg_nll(logprobs)))

    rows = {"project": [], "lm-eval + EOS": [], "hf": []}
    worst = 0.0
    for (req, res), p, h, n in zip(captured, plain_results, hf_results, hf_lengths):
        if not req.args[1].startswith(JOINT_MARKER):
            raise SystemExit(f"unexpected request {req.args[1][:40]!r}: the task no longer sends JOINT_MARKER")
        rows["project"].append((req.idx, res.n_tokens, prob(res.token_logprobs)))
        rows["lm-eval + EOS"].append((req.idx, p.n_tokens, prob(p.token_logprobs)))
        rows["hf"].append((req.idx, n, math.exp(h[0] / n)))
        if p.n_tokens != n + 1:
            raise SystemExit(f"doc {req.doc_id}: cru's plain span has {p.n_tokens} tokens, hf's {n} + EOS expected")
        worst = max(worst, abs(sum(p.token_logprobs[:-1]) - h[0]))
    # the task's own per-sample value for the answer, as a check of the project span's numbers
    samples = evaluated["samples"]["tofu_real_authors"]
    task_probs = [math.exp(-s["nll_answer"]) for s in sorted(samples, key=lambda s: s["doc_id"])]
    ours = [p for idx, _, p in rows["project"] if idx == 1]
    task_gap = max(abs(a - b) for a, b in zip(task_probs, ours))

    first = captured[0][0]
    shown = {"project": cru.encode_request(*first.args)[1], "lm-eval + EOS": cru.encode_request(*plain[0].args)[1],
             "hf": hf._encode_pair(*bare[0].args)[1]}

    def stats(name, answers_only):
        chosen = [(n, p) for idx, n, p in rows[name] if idx == 1 or not answers_only]
        return np.mean([n for n, _ in chosen]), np.mean([p for _, p in chosen]), len(chosen)

    ln_, lp_, k = stats("lm-eval + EOS", True)
    pn_, pp_, _ = stats("project", True)
    ok = round(ln_, 1) == 6.2 and round(pn_, 1) == 7.2 and round(lp_, 4) == 0.0125 and round(pp_, 4) == 0.0200
    lines = [
        "## 3. Scored span of a TOFU chat request: the project's vs lm-eval's own", "",
        "docs/protocol.md (TOFU, \"scored span (chat)\"): \"lm-eval alone scored `\\n` + answer + EOS (measured on "
        "SmolLM2, 40 Real Authors items: 6.2 → 7.2 scored tokens, mean normalised probability 0.0125 → 0.0200)\": "
        "lm-eval's pairing first, the project's span second.", "",
        f"Released SmolLM2-135M-Instruct (`{base}`, not fine-tuned), the first {k} docs of `tofu_real_authors` "
        f"(chat template, presets {metadata | {'data_dir': '…'}}), requests captured from `simple_evaluate` with "
        f"the `cru` model. Spans of doc 0's answer (decoded tokens):", ""]
    for name, ids in shown.items():
        lines.append(f"- {name}: {len(ids)} tokens {[cru.tokenizer.decode([i], skip_special_tokens=False) for i in ids]!r}")
    lines += ["", "| span | requests | mean scored tokens | mean normalised probability exp(-mean NLL) |",
              "|---|---|---|---|"]
    for name, label in (("lm-eval + EOS", "lm-eval's `_encode_pair` + EOS (`cru`, no JOINT_MARKER)"),
                        ("project", "project (`cru`, the task's JOINT_MARKER + EOS_MARKER request)"),
                        ("hf", "`hf` model on (ctx, answer): lm-eval unchanged, no EOS")):
        for answers_only in (True, False):
            n, p, count = stats(name, answers_only)
            lines.append(f"| {label} | {count} {'answers' if answers_only else 'all continuations'} | "
                         f"{n:.1f} ({n:.3f}) | {p:.4f} ({p:.6f}) |")
    lines += ["",
              f"Checks: `hf`'s log-prob sums equal the lm-eval + EOS span's less its EOS token within {worst:.2e} "
              f"(every request there has `hf`'s tokens + 1); the task's own per-sample `nll_answer` gives the project "
              f"row's answer probabilities within {task_gap:.2e}.", "",
              f"Verdict: doc 6.2 → 7.2 tokens, 0.0125 → 0.0200; measured {ln_:.1f} → {pn_:.1f} tokens, "
              f"{lp_:.4f} → {pp_:.4f}: {verdict(ok)}. ({time.perf_counter() - started:.0f} s)", ""]
    return lines


# ------------------------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("CRU_HARNESS_DATA_DIR"),
                        help="root of the local TOFU and RWKU copies (default: $CRU_HARNESS_DATA_DIR)")
    parser.add_argument("--config", default="configs/cpu_smollm2.yaml", help="the config whose CRU cell is read")
    parser.add_argument("--model", type=Path, help="a fine-tuned checkpoint this script wrote before (skips "
                        "fine-tuning)")
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/doc_meas"),
                        help="where the fine-tuned model is written (outside the repository)")
    parser.add_argument("--span-items", type=int, default=40)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not args.data_dir:
        sys.exit("give --data-dir (or set CRU_HARNESS_DATA_DIR): the measurements read the local TOFU and RWKU")
    torch.set_num_threads(1)
    import lm_eval
    import transformers

    command = " ".join(["python benchmarks/doc_measurements.py", *(argv if argv is not None else sys.argv[1:])])
    threads = os.environ.get("OMP_NUM_THREADS")
    lines = ["# Measured figures the docs quote", "",
             f"Written by `{'OMP_NUM_THREADS=' + threads + ' ' if threads else ''}{command}` "
             f"(benchmarks/doc_measurements.py's docstring says what each part measures and how).", "",
             f"Machine: {os.cpu_count()}-core CPU ({platform.machine()}, {platform.platform()}), "
             f"{'GPU present but unused' if torch.cuda.is_available() else 'no GPU'}, "
             f"torch.set_num_threads({torch.get_num_threads()}); python {platform.python_version()}, torch "
             f"{torch.__version__}, transformers {transformers.__version__}, lm_eval "
             f"{getattr(lm_eval, '__version__', '?')}.", ""]
    started = time.perf_counter()
    if "rwku" in args.parts:
        lines += measure_rwku(args.data_dir)
    if "gates" in args.parts:
        lines += measure_gates(args, args.data_dir)
    if "span" in args.parts:
        lines += measure_span(args, args.data_dir)
    lines += ["## Not measured", "",
              "docs/protocol.md, \"Fluency tokens\": the regex sentence splitter against nltk's punkt (0.003 bits on "
              "300 RWKU passages) needs nltk's punkt data, which is not on this machine and cannot be downloaded "
              "(no network).", "", f"Total: {time.perf_counter() - started:.0f} s."]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
