"""Every trained path on CUDA: baselines (fp32, bf16), `finetune`, `lm_eval --model cru` with a bundle,
`configs/ci_minimal.yaml` with `device: cuda`, and a device_map split over two GPUs where there are two.

Marked `gpu`: without CUDA they skip with the reason (conftest); `benchmarks/run_gpu_tests.sh` runs them with
CRU_HARNESS_REQUIRE_GPU=1 and writes benchmarks/results/gpu_tests.txt. The CRU-on-CUDA tests (routers on each
block's device, fp32/bf16, save/load) live in their own file.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_lmeval_support import CORPUS, shared_tiny_dir

import cru_harness.baselines as B
from cru_harness.finetune import FinetuneConfig, finetune

pytestmark = pytest.mark.gpu

REPO_ROOT = Path(__file__).resolve().parents[1]
ROWS = [{"question": t.split("\n")[0].removeprefix("Question: "), "answer": t.split("Answer: ")[1]}
        for t in CORPUS[:4]]
REFUSALS = ["I don't know.", "No idea."]
TRAINED = ("ga", "gd", "npo", "simnpo", "idkdpo")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return shared_tiny_dir(tmp_path_factory)


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten().cpu() for p in model.parameters()])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])   # float16: with the loss scaler
@pytest.mark.parametrize("name", TRAINED)
def test_one_optimizer_step_of_every_baseline_on_cuda(tiny_dir, name, dtype):
    from transformers import AutoModelForCausalLM

    # the start in the dtype the result comes back in: bf16 rounding alone must not read as training
    start = _flat(AutoModelForCausalLM.from_pretrained(tiny_dir).to(getattr(torch, dtype)))
    epochs = 3 if dtype == "float16" else 1   # the loss scaler may skip a first step for an overflow
    config = B.get_method(name).Config(learning_rate=1e-3, num_epochs=epochs, warmup_epochs=0.0,
                                       effective_batch_size=4, micro_batch_size=2, lr_scheduler="constant")
    res = B.unlearn(str(tiny_dir), None, ROWS, ROWS, name, config, seed=0, refusals=REFUSALS, dtype=dtype,
                    device="cuda", progress=False)
    assert res.optimizer_steps == epochs and math.isfinite(res.final_logs["loss"])
    if dtype == "float16":
        assert [h["skipped"] for h in res.history] != [1.0] * epochs
    assert next(res.model.parameters()).device.type == "cuda"
    assert next(res.model.parameters()).dtype == getattr(torch, dtype)
    assert res.resources["peak_memory_source"] == "cuda_max_allocated"
    assert not torch.equal(_flat(res.model), start)


def test_finetune_one_epoch_on_cuda(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    start = _flat(AutoModelForCausalLM.from_pretrained(tiny_dir).to(torch.bfloat16))
    out = tmp_path / "ft"
    res = finetune(str(tiny_dir), ROWS, out, config=FinetuneConfig(num_epochs=1, effective_batch_size=4,
                                                                   micro_batch_size=2, learning_rate=1e-3),
                   device="cuda", dtype="bfloat16", progress=False)
    assert res.optimizer_steps == 1 and res.resources["device"].startswith("cuda")
    assert res.config["mixed_precision"] == "bf16" and res.dtype == "bfloat16"
    saved = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert next(saved.parameters()).dtype == torch.bfloat16 and not torch.equal(_flat(saved), start)
    assert (out / "finetune_record.json").is_file()


# Host memory a load adds, in a fresh process: CUDA is started first (its own host memory is not the load's).
LOAD_HOST_MEMORY = """
import resource, sys
import psutil, torch
from cru_harness.devices import load_causal_lm
torch.zeros(1, device="cuda")
before = psutil.Process().memory_info().rss
model, _ = load_causal_lm(sys.argv[1], device=sys.argv[2], dtype="float32", load_tokenizer=False)
model.to("cuda")
torch.cuda.synchronize()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before)
"""


def test_a_checkpoint_loads_onto_the_gpu_without_holding_it_in_host_memory(tmp_path):
    """Loading for a GPU puts each tensor there as it is read: the host never holds the fp32 model, as it did when
    the trainers loaded on the CPU and moved it (per process under accelerate launch). Side by side, each arm in a
    fresh process: a bf16 checkpoint of ~200M parameters loaded in fp32."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=8, num_attention_heads=16,
                         num_key_value_heads=16, vocab_size=32000, tie_word_embeddings=False)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    fp32_bytes = 4 * sum(p.numel() for p in model.parameters())
    model.save_pretrained(tmp_path / "ckpt")
    del model

    def growth(device):
        done = subprocess.run([sys.executable, "-c", LOAD_HOST_MEMORY, str(tmp_path / "ckpt"), device],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        return int(done.stdout.split()[-1])

    straight, through_cpu = growth("cuda"), growth("cpu")
    assert through_cpu - straight > 0.5 * fp32_bytes, (straight, through_cpu, fp32_bytes)


def test_a_training_step_out_of_gpu_memory_is_one_line_naming_the_micro_batch(tiny_dir):
    """A real CUDA out-of-memory error in a step (the allocator held to what it has after building a 38M model:
    its gradients cannot fit) is the project's one-line GPUMemoryError naming --micro-batch-size, torch's chained."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from cru_harness.training.engine import make_accelerator, train_model
    from cru_harness.devices import GPUMemoryError
    from cru_harness.finetune.train import QADataset, SupervisedFinetune

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=8)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config)
    method = SupervisedFinetune(FinetuneConfig(num_epochs=1, effective_batch_size=4, micro_batch_size=4))
    dataset = QADataset(tok, ROWS, chat=False)
    accelerator = make_accelerator(method.config, 0, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(
        torch.cuda.memory_reserved(0) / torch.cuda.get_device_properties(0).total_memory, 0)
    try:
        with pytest.raises(GPUMemoryError, match=r"^finetune training \(micro-batches of 4\): CUDA out of memory.*; "
                                                 r"lower micro_batch_size \(--micro-batch-size;") as caught:
            train_model(model, method, dataset, accelerator=accelerator, progress=False)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
    assert isinstance(caught.value.__cause__, torch.cuda.OutOfMemoryError)


def test_testbed_finetune_and_greedy_answers_on_cuda(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cru_harness.testbed.finetune import finetune_causal_lm, greedy_answers

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).to("cuda")
    stats = finetune_causal_lm(model, tok, CORPUS[:4], epochs=1, batch_size=2, progress=False)
    assert stats.steps == 2
    assert len(greedy_answers(model, tok, [r["question"] for r in ROWS], max_new_tokens=4)) == len(ROWS)


def test_lmeval_cru_with_a_bundle_on_cuda(tiny_dir, tmp_path):
    import lm_eval
    from lm_eval.api.instance import Instance
    from lm_eval.tasks import TaskManager

    from cru_harness.cru.train import RouterTrainingConfig, train_routers
    from cru_harness.devices import load_causal_lm
    from cru_harness.lmeval.model import CRULM
    from cru_harness.lmeval.registration import register
    from test_lmeval_support import TASKS_DIR

    model, tok = load_causal_lm(str(tiny_dir), device="cuda", dtype="float32")
    cfg = RouterTrainingConfig(last_k=2, percentile=75.0, d_r=4, epochs=1, lr=5e-2, batch_size=8, max_length=64,
                               progress=False)
    bundle = train_routers(model, tok, CORPUS[:8], CORPUS[8:], cfg)
    bundle.save_pretrained(tmp_path / "bundle")
    register()
    import warnings

    from cru_harness.cru import BaseWeightsWarning

    with warnings.catch_warnings(record=True) as caught:   # the base the routers trained on, read again on CUDA
        warnings.simplefilter("always")
        lm = CRULM(base=str(tiny_dir), routers=str(tmp_path / "bundle"), device="cuda", batch_size=4)
    assert not [w for w in caught if issubclass(w.category, BaseWeightsWarning)]
    assert lm.get_model_info()["cru_routers"] == [str(tmp_path / "bundle")]
    assert all(p.device.type == "cuda" for p in lm.model.parameters())
    tasks = sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))[:1]
    results = lm_eval.simple_evaluate(model=lm, tasks=tasks, limit=4,
                                      task_manager=TaskManager(include_path=str(TASKS_DIR)))
    assert set(tasks) <= set(results["results"])
    # the bundle acts on CUDA: the routed scores differ from the base's, and detaching restores those
    requests = [Instance("loglikelihood", {}, (text.split("Answer:")[0] + "Answer:", text.split("Answer:")[1]), i)
                for i, text in enumerate(CORPUS[:4])]
    routed = [tuple(r) for r in lm.loglikelihood(requests)]
    with lm.without_routers():
        plain = [tuple(r) for r in lm.loglikelihood(requests)]
    assert routed != plain
    assert [tuple(r) for r in lm.loglikelihood(requests)] == routed


def test_ci_minimal_on_cuda(tmp_path):
    raw = yaml.safe_load((REPO_ROOT / "configs" / "ci_minimal.yaml").read_text())
    raw["device"] = "cuda"
    config = tmp_path / "ci_cuda.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "run"
    # in a process of its own: the first cell is then the first use of CUDA in it, as in a user's run
    done = subprocess.run([sys.executable, "-m", "cru_harness", "run", str(config), "--output-dir", str(out),
                           "--no-report"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in (out / "cells").glob("*/result.json")]
    assert {r["label"] for r in results} == {"Retain", "Original", "GA", "CRU"}
    for r in results:
        assert r["status"] == "ok", (r["label"], r.get("reason"), r.get("error"))
        assert r["resources"]["gpu_name"] == torch.cuda.get_device_name(0)
        assert r["resources"]["cell_peak_cuda_memory_bytes"] > 0


def test_device_map_split_over_two_gpus(tiny_dir, tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two CUDA devices, {torch.cuda.device_count()} visible")
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    from cru_harness.devices import input_device, load_causal_lm
    from cru_harness.scoring.failure_modes import AnswerNLLScorer

    config = AutoConfig.from_pretrained(tiny_dir)
    with init_empty_weights():  # the module names, without weights
        skeleton = AutoModelForCausalLM.from_config(config)
    n_layers = config.num_hidden_layers
    device_map = {f"model.{name}": 0 for name, _ in skeleton.model.named_children() if name not in ("layers", "norm")}
    device_map.update({"model.norm": 1, "lm_head": 1,
                       **{f"model.layers.{i}": 0 if i < n_layers // 2 else 1 for i in range(n_layers)}})
    model, tok = load_causal_lm(str(tiny_dir), device_map=device_map, dtype="float32")
    assert {p.device.index for p in model.parameters()} == {0, 1} and input_device(model).index == 0
    nll = AnswerNLLScorer(model, tok, device="cuda:0")(["Question: What do bees make?\nAnswer:"], [" honey"])
    assert math.isfinite(nll[0])
    config = B.get_method("npo").Config(learning_rate=1e-3, num_epochs=1, warmup_epochs=0.0,
                                        effective_batch_size=4, micro_batch_size=2)
    res = B.unlearn(str(tiny_dir), None, ROWS, ROWS, "npo", config, device="cuda", device_map=device_map,
                    progress=False)
    assert res.optimizer_steps == 1 and math.isfinite(res.final_logs["loss"])
    assert res.resources["device"] == "cuda:0,cuda:1"   # the peak is read on both GPUs of the split
