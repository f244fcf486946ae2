"""CRU on models that know something: the fine-tuned tiny testbed model, and SmolLM2-135M-Instruct (slow)."""
import time

import pytest
import torch

from cru_harness.cru import RouterTrainingConfig, routed, train_routers

torch.set_num_threads(1)  # 2 shared cores: one thread is ~10x faster than two under contention


def _greedy_answers(model, tokenizer, prompts, max_new_tokens=40, batch_size=16):
    """Greedy continuations of `prompts` (left-padded batches), decoded without special tokens."""
    previous_side, previous_pad = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"
    # SmolLM2's tokenizer converted from its GGUF has no pad token under transformers 5.17 (the GPU image's);
    # pad with EOS there, as lm-eval does, under the attention mask.
    tokenizer.pad_token = previous_pad if previous_pad is not None else tokenizer.eos_token
    answers = []
    try:
        for start in range(0, len(prompts), batch_size):
            batch = tokenizer(prompts[start:start + batch_size], return_tensors="pt", padding=True)
            with torch.no_grad():
                out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
            answers += tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    finally:
        tokenizer.padding_side, tokenizer.pad_token = previous_side, previous_pad
    return [a.strip() for a in answers]


def _rouge_l_recall(predictions, references):
    from rouge_score.rouge_scorer import RougeScorer

    scorer = RougeScorer(["rougeL"], use_stemmer=True)
    scores = [scorer.score(ref, pred)["rougeL"].recall for pred, ref in zip(predictions, references)]
    return sum(scores) / len(scores)


@pytest.mark.slow
def test_finetuned_tiny_model_gates_separate_and_rouge_measured():
    """Spec test 5: on the fine-tuned tiny model, forget gates close (<= 0.25) and retain gates stay open
    (>= 0.7). ROUGE-L recall of greedy answers before/after is printed (run with -s), not asserted."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cru_harness.data.corpora import format_qa
    from cru_harness.benchmarks.tofu.data import load_tofu
    from cru_harness.testbed.finetune import format_qa_prompt
    from cru_harness.testbed.zoo import checkpoint_record, tiny_checkpoint

    checkpoint = tiny_checkpoint("llama", "finetuned")
    world_dir = checkpoint_record(checkpoint)["world_dir"]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    forget_rows = load_tofu("forget10", world_dir)
    retain_rows = load_tofu("retain90", world_dir)[::4]  # a quarter of retain90 keeps the test fast
    forget = [format_qa(r["question"], r["answer"]) for r in forget_rows]
    retain = [format_qa(r["question"], r["answer"]) for r in retain_rows]
    before_params = {n: p.detach().clone() for n, p in model.named_parameters()}

    started = time.perf_counter()
    # lambda 1.5 with rms input: lambda=1 left retain gates at ~0.70, lambda=2 forget gates at ~0.26 here.
    config = RouterTrainingConfig(epochs=60, lr=1e-2, lam=1.5, batch_size=8, max_length=128, input_norm="rms",
                                  progress=False)
    bundle = train_routers(model, tokenizer, forget, retain, config)
    seconds = time.perf_counter() - started
    metrics = bundle.config.metrics
    assert all(torch.equal(before_params[n], p) for n, p in model.named_parameters())

    probe_forget, probe_retain = forget_rows[:20], retain_rows[:20]
    rouge = {}
    for name, rows in (("forget", probe_forget), ("retain", probe_retain)):
        prompts = [format_qa_prompt(r["question"]) for r in rows]
        references = [r["answer"] for r in rows]
        rouge[f"{name}_before"] = _rouge_l_recall(_greedy_answers(model, tokenizer, prompts), references)
        with routed(model, bundle):
            rouge[f"{name}_after"] = _rouge_l_recall(_greedy_answers(model, tokenizer, prompts), references)
    print(f"\n[tiny llama finetuned] {metrics['steps']} steps in {seconds:.1f}s; gate mean forget "
          f"{metrics['forget_gate_mean']:.3f} retain {metrics['retain_gate_mean']:.3f}; |C_l| "
          f"{ {b: len(c) for b, c in bundle.config.neurons.items()} }")
    print("[tiny llama finetuned] ROUGE-L recall " + ", ".join(f"{k} {v:.3f}" for k, v in rouge.items()))
    assert metrics["forget_gate_mean"] <= 0.25
    assert metrics["retain_gate_mean"] >= 0.7


@pytest.mark.slow
@pytest.mark.shared_data
def test_smollm2_stephen_king(rwku_dir):
    """Spec test 7 on a real model: SmolLM2-135M-Instruct, forget = RWKU target 1 (Stephen King) passages,
    retain = passages of targets 2-3. Gate means and one generation before/after are printed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cru_harness.data.corpora import load_corpus
    from cru_harness.testbed.smollm import materialize_smollm2

    path = materialize_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    forget = load_corpus("rwku:1:passage", rwku_dir)[:32]
    retain = load_corpus("rwku:2-3:passage", rwku_dir)[::8][:32]
    before_params = {n: p.detach().clone() for n, p in model.named_parameters()}
    prompt = "Stephen King is best known for writing"

    started = time.perf_counter()
    # rms input normalisation: SmolLM2's residual stream has |h| ~ 1e4 outliers (observations.md); with it,
    # lambda=1 separates the corpora in 20 steps (lambda=50 saturated every gate at 1 within that budget).
    config = RouterTrainingConfig(percentile=90, lam=1.0, d_r=32, lr=1e-2, input_norm="rms", epochs=5,
                                  batch_size=8, max_length=64, progress=False)
    bundle = train_routers(model, tokenizer, forget, retain, config)
    seconds = time.perf_counter() - started
    metrics = bundle.config.metrics
    assert all(torch.equal(before_params[n], p) for n, p in model.named_parameters())

    before = _greedy_answers(model, tokenizer, [prompt], max_new_tokens=25)[0]
    with routed(model, bundle):
        after = _greedy_answers(model, tokenizer, [prompt], max_new_tokens=25)[0]
    print(f"\n[SmolLM2] {metrics['steps']} steps in {seconds:.1f}s; blocks {bundle.block_indices}; "
          f"router params {bundle.config.router_parameters:,} "
          f"({100 * bundle.config.router_parameters / bundle.config.base_parameters:.3f}% of base)")
    print(f"[SmolLM2] gate mean forget {metrics['forget_gate_mean']:.3f} retain {metrics['retain_gate_mean']:.3f}")
    print(f"[SmolLM2] before: {prompt} {before!r}\n[SmolLM2] after:  {prompt} {after!r}")
    assert metrics["forget_gate_mean"] <= 0.25
    assert metrics["retain_gate_mean"] >= 0.7
