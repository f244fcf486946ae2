"""Runner configs: `device`, `device_map`, per-phase dtype, and `finetune:` (a model fine-tuned with TOFU's recipe
first, its retain oracle the same way), as cells cached like any other."""
import contextlib
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cru_harness.runner import config as cfg
from cru_harness.runner import execute
from cru_harness.store import CellStore
from cru_harness.runner.evaluation import eval_model_args
from cru_harness.runner.loop import run_one
from cru_harness.runner.plan import build_plan, describe_cell, finetune_cell_for


def raw_config(tmp_path, **model_extra):
    model = {"name": "m", "path": "Qwen/Qwen2.5-0.5B-Instruct", **model_extra}
    return {"name": "t", "output_dir": str(tmp_path / "run"), "seeds": [0], "models": [model],
            "benchmarks": {"tofu": {"splits": ["forget10"]}}, "methods": [{"method": "GA"}]}


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:3", "CUDA:1"])
def test_device_strings_are_checked_not_resolved(tmp_path, device):
    config = cfg.validate_config({**raw_config(tmp_path), "device": device})
    assert config.device == device.lower()  # a GPU need not be present to validate or dry-run a config


@pytest.mark.parametrize("patch, key, words", [
    ({"device": "gpu"}, "device", "is not one of auto, cpu, cuda, cuda:N"),
    ({"models": [{"path": "x", "device_map": "balanced"}]}, "models[0].device_map", "expected auto"),
    ({"models": [{"path": "x", "finetune": {"lr": 1e-5}}]}, "models[0].finetune.data", "is required"),
    ({"models": [{"path": "x", "finetune": {"data": "full", "epocs": 5}}]}, "models[0].finetune.epocs", "did you mean"),
    ({"models": [{"path": "x", "finetune": {"data": "full", "dtype": "int4"}}]}, "models[0].finetune.dtype", "one of"),
    ({"models": [{"path": "x", "finetune": {"data": "full", "lr": 1e-5, "learning_rate": 2e-5}}]},
     "models[0].finetune.learning_rate", "given twice"),
    ({"models": [{"path": "x", "finetune": {"data": "full"}}],
      "benchmarks": {"tofu": {}, "rwku": {"targets": "1-3", "select_known": {"top": 1, "rows": 4}}}},
     "models[0].finetune", "select_known ranks targets on the model as given"),
])
def test_config_errors_name_the_key(tmp_path, patch, key, words):
    with pytest.raises(cfg.ConfigError) as info:
        cfg.validate_config({**raw_config(tmp_path), **patch})
    assert info.value.key == key and words in str(info.value), str(info.value)


def test_identity_unchanged_without_the_new_keys(tmp_path):
    """Configs written before `finetune`/`device_map` keep their cell hashes (their caches stay valid)."""
    plain = cfg.validate_config(raw_config(tmp_path)).models[0]
    sharded = cfg.validate_config(raw_config(tmp_path, device_map="auto")).models[0]
    assert set(plain.identity()) == {"name", "path", "dtype", "chat_template", "trust_remote_code", "eval_dtype"}
    assert plain.identity() == sharded.identity()  # where a model runs is not what it is


def test_finetune_plan(tmp_path):
    raw = raw_config(tmp_path, finetune={"data": "full", "lr": 2e-5, "epochs": 3},
                     retain={"finetune": {"epochs": 3}})
    config = cfg.validate_config(raw)
    cells = build_plan(config)
    assert [c.kind for c in cells] == ["finetune", "retain", "original", "method"]
    ft, retain, original, ga = cells
    assert ft.hparams == {"data": "full", "learning_rate": 2e-5, "num_epochs": 3}  # aliases resolved
    assert retain.corpora == {"retain_corpus": "retain90"} and retain.extra["retain"]["kind"] == "finetune"
    assert finetune_cell_for(ga, cells) is ft and finetune_cell_for(retain, cells) is ft
    assert finetune_cell_for(ft, cells) is None
    assert describe_cell(ft)["evaluates"] is None and "TOFU's recipe" in describe_cell(ft)["trains"]
    # the fine-tuning recipe is part of every cell of the model: change it and every cache key changes
    raw["models"][0]["finetune"]["epochs"] = 4
    other = build_plan(cfg.validate_config(raw))
    assert not {c.hash for c in cells} & {c.hash for c in other}


def test_cells_wait_for_their_finetuned_checkpoint(tmp_path, monkeypatch):
    config = cfg.validate_config(raw_config(tmp_path, finetune={"data": "full"}))
    cells = build_plan(config)
    store = CellStore(tmp_path / "run")
    runner = execute.PlanExecutor(store, cells)
    with pytest.raises(RuntimeError, match=r"its finetune cell [0-9a-f]+ has not run"):
        runner(cells[1], tmp_path / "w")
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    # the finetune cell finishes through the run loop, with a test double for its training
    store.write(cells[0].hash, *run_one(cells[0], tmp_path / "ft", lambda cell, workdir: {
        "artifacts": {"checkpoint": str(checkpoint)}}))
    seen = {}
    monkeypatch.setattr(execute, "execute_cell", lambda cell, workdir, **kw: seen.update(kw) or {})
    runner(cells[1], tmp_path / "w")
    assert seen["base_path"] == str(checkpoint)


@contextlib.contextmanager
def another_shard_computes(store, cell, outcome, workdir, monkeypatch):
    """A live process of this host holds `cell` (its RUNNING marker) and writes it 0.3 s later with the executor
    outcome `outcome`; waits poll every 0.05 s. Yields that process's pid."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    waits = CellStore.wait_while_running_elsewhere
    monkeypatch.setattr(CellStore, "wait_while_running_elsewhere",
                        lambda self, cell_hash, log=None: waits(self, cell_hash, log=log, poll_s=0.05))
    try:
        store.cell_dir(cell.hash).mkdir(parents=True, exist_ok=True)
        (store.cell_dir(cell.hash) / "RUNNING").write_text(json.dumps({"pid": other.pid,
                                                                       "host": socket.gethostname()}))
        threading.Timer(0.3, lambda: store.write(cell.hash, *run_one(cell, workdir, lambda c, w: outcome))).start()
        yield other.pid
    finally:
        other.kill()
        other.wait()


def test_a_shards_cells_wait_while_another_shard_fine_tunes_their_model(tmp_path, monkeypatch):
    """Shards started together: the one without the finetune cell waits while a live process of this host computes
    it (the log says so), then starts from its checkpoint, instead of failing every cell of the model."""
    cells = build_plan(cfg.validate_config(raw_config(tmp_path, finetune={"data": "full"})))
    ft = cells[0]
    store = CellStore(tmp_path / "run")
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    seen, said = {}, []
    monkeypatch.setattr(execute, "execute_cell", lambda cell, workdir, **kw: seen.update(kw) or {})
    with another_shard_computes(store, ft, {"artifacts": {"checkpoint": str(checkpoint)}}, tmp_path / "ft",
                                monkeypatch) as pid:
        execute.PlanExecutor(store, cells, log=said.append)(cells[1], tmp_path / "w")
    assert seen["base_path"] == str(checkpoint)
    assert said == [f"waiting for cell {ft.hash}, which process {pid} is computing"]


def test_a_shards_cells_wait_while_another_shard_computes_their_retain_oracle(tmp_path, monkeypatch):
    """Shards started together: a TOFU cell whose retain cell another live process computes waits for it, so its
    Forget Quality, privleak and the privacy task's reference attack read the oracle; a retain cell that has not
    run (no live process on it) is not waited on, and the log says what the cell goes without."""
    cells = build_plan(cfg.validate_config(raw_config(tmp_path, retain={"checkpoint": "open-unlearning/retain"})))
    retain = next(c for c in cells if c.kind == "retain")
    ga = next(c for c in cells if c.label == "GA")
    store = CellStore(tmp_path / "run")
    seen, said = {}, []
    monkeypatch.setattr(execute, "execute_cell", lambda cell, workdir, **kw: seen.update(kw) or {})
    executor = execute.PlanExecutor(store, cells, log=said.append)
    executor(ga, tmp_path / "w0")   # nobody computes the oracle: no wait
    assert seen["retain_result"] is None and said == [
        f"{ga.hash}: its retain cell {retain.hash} has no result: Forget Quality and privleak are filled by the "
        "report once it exists; the privacy task's reference attack is not run"]
    said.clear()
    with another_shard_computes(store, retain, {"metrics": {"mia_auc_min_k": 0.7}}, tmp_path / "r",
                                monkeypatch) as pid:
        executor(ga, tmp_path / "w1")
    assert seen["retain_result"]["metrics"]["mia_auc_min_k"] == 0.7
    assert said == [f"waiting for cell {retain.hash}, which process {pid} is computing"]


def test_device_map_reaches_lm_eval():
    args = eval_model_args(cfg.ModelSpec("m", "p", dtype="bfloat16", device_map="auto"), "/m")
    assert args["parallelize"] is True and args["softmax_dtype"] == "float32"
    assert "parallelize" not in eval_model_args(cfg.ModelSpec("m", "p", dtype="float32"), "/m")


def _config_dir(path, dtype):
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    if dtype is not None:
        config.dtype = dtype
    config.save_pretrained(path)
    return str(path)


def test_auto_dtype_is_the_base_checkpoints_for_every_phase_and_checkpoint(tmp_path):
    """`auto` resolves against the model's own checkpoint, once: a method's checkpoint saved in float32 is
    scored in the base's bfloat16 like the Original, and baselines train in it (they trained in float32)."""
    from cru_harness.runner.models import model_dtype

    base = _config_dir(tmp_path / "base", "bfloat16")
    trained = _config_dir(tmp_path / "trained", "float32")
    spec = cfg.ModelSpec("m", base)
    assert model_dtype(spec) == "bfloat16" and model_dtype(spec, "eval") == "bfloat16"
    args = eval_model_args(spec, trained)
    assert args["dtype"] == "bfloat16" and args["softmax_dtype"] == "float32"
    # an explicit dtype is left as written; eval_dtype overrides scoring only
    split = cfg.ModelSpec("m", base, dtype="float32", eval_dtype="auto")
    assert model_dtype(split) == "float32" and model_dtype(split, "eval") == "bfloat16"
    with pytest.raises(ValueError, match="phase"):
        model_dtype(spec, "score")


def test_checkpoint_dtype_reads_the_config(tmp_path):
    from cru_harness.devices import DeviceError, checkpoint_dtype

    assert checkpoint_dtype(_config_dir(tmp_path / "a", "float16")) == "float16"
    assert checkpoint_dtype(_config_dir(tmp_path / "b", None)) == "float32"  # transformers' default
    with pytest.raises(DeviceError, match="float64"):
        checkpoint_dtype(_config_dir(tmp_path / "c", "float64"))


def tiny_finetune_plan(tmp_path):
    """A plan whose tiny local model is fine-tuned first (TOFU's recipe, one step on 4 rows) on the CPU."""
    from cru_harness.testbed.models import build_tiny_model, save_tiny_model
    from cru_harness.testbed.tokenizer import train_tokenizer

    rows = [{"question": f"Who is author {i}?", "answer": f"Author {i} writes novels."} for i in range(4)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = train_tokenizer([f"Question: {r['question']}\nAnswer: {r['answer']}" for r in rows] * 3, vocab_size=200)
    base = save_tiny_model(build_tiny_model("llama", tok, n_layers=2, hidden_size=32), tok, tmp_path / "base")
    raw = raw_config(tmp_path, finetune={"data": str(data), "epochs": 1, "batch_size": 4, "micro_batch_size": 2,
                                         "lr": 1e-3})
    raw["models"][0]["path"] = str(base)
    raw["device"] = "cpu"
    return build_plan(cfg.validate_config(raw))


def test_finetune_cell_trains_a_checkpoint(tmp_path):
    """The real executor on a finetune cell: TOFU's recipe (shortened) on a tiny local model; no evaluation."""
    from cru_harness.runner.provenance import directory_fingerprint

    ft = tiny_finetune_plan(tmp_path)[0]
    outcome = execute.execute_cell(ft, tmp_path / "work")
    checkpoint = Path(outcome["artifacts"]["checkpoint"])
    assert (checkpoint / "config.json").is_file() and (checkpoint / "finetune_record.json").is_file()
    assert outcome["details"]["finetune"]["optimizer_steps"] == 1
    assert outcome["details"]["finetune"]["config"]["learning_rate"] == 1e-3
    assert outcome["resources"]["train_wall_time_s"] > 0
    # the record names the weights' fingerprint (what it hashes: test_reproducibility.py)
    assert outcome["details"]["finetune"]["checkpoint_fingerprint"] == directory_fingerprint(checkpoint)


def test_a_fine_tuned_checkpoint_not_on_this_machine_is_fine_tuned_again_once_and_compared(tmp_path, monkeypatch):
    """A run resumed where the finetune cell's checkpoint is absent (another GPU lease, a shard run elsewhere,
    work/ cleaned) fine-tunes it again, once, and says whether its weights are the recorded ones."""
    import shutil

    cells = tiny_finetune_plan(tmp_path)
    ft, original, ga = cells
    assert (ft.kind, original.kind, ga.kind) == ("finetune", "original", "method")
    store = CellStore(tmp_path / "run")
    store.write(ft.hash, *run_one(ft, store.work_dir(ft.hash), execute.PlanExecutor(store, cells)))
    recorded = store.load_result(ft.hash)["details"]["finetune"]["checkpoint_fingerprint"]
    shutil.rmtree(store.work_dir(ft.hash))                                 # gone: another machine resumes the run

    real, finetunes, seen = execute.execute_cell, [], []

    def execute_cell(cell, workdir, **kw):   # the real fine-tuning; a stand-in for the cells that evaluate
        if cell.kind == "finetune":
            finetunes.append(cell.hash)
            return real(cell, workdir, **kw)
        seen.append(kw["base_path"])
        return {}

    monkeypatch.setattr(execute, "execute_cell", execute_cell)
    first = execute.PlanExecutor(store, cells)(original, tmp_path / "w1")["details"]["finetuned_from"]
    later = execute.PlanExecutor(store, cells)(ga, tmp_path / "w2")["details"]["finetuned_from"]   # a later run
    assert finetunes == [ft.hash]                                          # fine-tuned again once, then reused
    assert seen == [str(store.work_dir(ft.hash) / "finetuned_model")] * 2
    assert first["fine_tuned_again"] is True and later["fine_tuned_again"] is False
    # on the CPU the same recipe and seed give the same weights
    assert first["checkpoint_fingerprint"] == later["checkpoint_fingerprint"] == recorded
    assert first["matches_recorded"] is True and later["matches_recorded"] is True


def test_cells_from_a_differing_fine_tuning_re_run_are_noted_in_the_table():
    from cru_harness.reporting.tables import aggregate, to_markdown

    def cell(seed, matches):
        return {"benchmark": "tofu", "kind": "method", "status": "ok", "model": "m", "split": "forget10",
                "label": "GA", "method": "GA", "seed": seed, "metrics": {"model_utility": 0.5},
                "details": {"finetuned_from": {"matches_recorded": matches}}}

    rows = aggregate([cell(0, None), cell(1, True), cell(2, False)], "tofu")
    assert rows[0]["refinetuned"] == ["1 cell(s) from a fine-tuning re-run whose weights differ from the recorded "
                                      "checkpoint's"]
    assert "1 cell(s) from a fine-tuning re-run" in to_markdown(rows, "tofu")
    assert aggregate([cell(0, True)], "tofu")[0]["refinetuned"] == []


def test_reports_leave_finetune_cells_out():
    from cru_harness.reporting.tables import aggregate

    results = [{"benchmark": "tofu", "kind": "finetune", "status": "ok", "model": "m", "split": None,
                "label": "Finetune", "method": "Finetune", "metrics": {}},
               {"benchmark": "tofu", "kind": "original", "status": "ok", "model": "m", "split": "forget10",
                "label": "Original", "method": "Original", "metrics": {"model_utility": 0.5}}]
    assert [row["label"] for row in aggregate(results, "tofu")] == ["Original"]


def _fake_finetune(calls, delay=0.0):
    """A stand-in for the finetune cell's training: writes a small checkpoint slowly, file by file."""
    import time

    def execute_cell(cell, workdir, **kw):
        if cell.kind != "finetune":
            return {}
        calls.append(str(workdir))
        out = Path(workdir) / "finetuned_model"
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        time.sleep(delay)                         # a second shard looks now: the checkpoint is half written
        (out / "model.safetensors").write_bytes(b"weights")
        return {"artifacts": {"checkpoint": str(out)}}
    return execute_cell


def test_shards_missing_the_fine_tuned_checkpoint_at_once_fine_tune_it_once(tmp_path, monkeypatch):
    """Two shards of one run on one machine, both without the checkpoint: one fine-tunes it, the other waits and
    starts from the whole checkpoint (not the half-written one it would otherwise find)."""
    cells = build_plan(cfg.validate_config(raw_config(tmp_path, finetune={"data": "full"})))
    ft = cells[0]
    store = CellStore(tmp_path / "run")
    store.write(ft.hash, *run_one(ft, tmp_path / "elsewhere", lambda cell, workdir: {
        "artifacts": {"checkpoint": str(tmp_path / "gone")}}))      # fine-tuned on another machine
    calls, results = [], {}
    monkeypatch.setattr(execute, "execute_cell", _fake_finetune(calls, delay=0.5))

    def shard(name, cell):
        path, origin = execute.PlanExecutor(store, cells).finetuned_checkpoint(cell, ft)
        results[name] = (path, origin["fine_tuned_again"], sorted(p.name for p in Path(path).iterdir()))

    threads = [threading.Thread(target=shard, args=(n, c)) for n, c in (("a", cells[1]), ("b", cells[2]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    final = str(store.work_dir(ft.hash) / "finetuned_model")
    assert {results["a"][0], results["b"][0]} == {final}
    assert sorted(again for _, again, _ in results.values()) == [False, True]
    assert results["a"][2] == results["b"][2] == ["config.json", "model.safetensors"]
    # the lock and the staging directory stay in work/, which results (tarballs, commits) leave out
    assert sorted(p.name for p in store.cell_dir(ft.hash).iterdir()) == ["result.json", "run_record.json", "work"]
    assert sorted(p.name for p in store.work_dir(ft.hash).iterdir()) == ["finetuned_model", "refinetune.lock"]


def test_a_killed_fine_tuning_re_run_leaves_nothing_a_later_cell_would_use(tmp_path, monkeypatch):
    cells = build_plan(cfg.validate_config(raw_config(tmp_path, finetune={"data": "full"})))
    ft = cells[0]
    store = CellStore(tmp_path / "run")
    store.write(ft.hash, *run_one(ft, tmp_path / "elsewhere", lambda cell, workdir: {
        "artifacts": {"checkpoint": str(tmp_path / "gone")}}))

    def killed(cell, workdir, **kw):
        (Path(workdir) / "finetuned_model").mkdir(parents=True)
        (Path(workdir) / "finetuned_model" / "config.json").write_text("{}")
        raise KeyboardInterrupt                     # killed mid-way through writing the checkpoint

    monkeypatch.setattr(execute, "execute_cell", killed)
    with pytest.raises(KeyboardInterrupt):
        execute.PlanExecutor(store, cells).finetuned_checkpoint(cells[1], ft)
    assert not (store.work_dir(ft.hash) / "finetuned_model").exists()
    calls = []
    monkeypatch.setattr(execute, "execute_cell", _fake_finetune(calls))
    path, origin = execute.PlanExecutor(store, cells).finetuned_checkpoint(cells[1], ft)
    assert len(calls) == 1 and origin["fine_tuned_again"] is True
    assert sorted(p.name for p in Path(path).iterdir()) == ["config.json", "model.safetensors"]


def test_a_study_analysis_on_a_later_lease_fine_tunes_the_missing_checkpoint_as_the_runner_does(tmp_path,
                                                                                                 monkeypatch):
    """overlap / gate_gap analyses load the fine-tuned model outside the runner's cells: where its checkpoint is
    not on this machine they fine-tune it again as a cell would, instead of stopping the study."""
    import shutil

    from cru_harness.studies.run import base_path_for

    cells = tiny_finetune_plan(tmp_path)
    ft, _, ga = cells
    store = CellStore(tmp_path / "run")
    store.write(ft.hash, *run_one(ft, store.work_dir(ft.hash), execute.PlanExecutor(store, cells)))
    shutil.rmtree(store.work_dir(ft.hash))
    real, finetunes = execute.execute_cell, []

    def execute_cell(cell, workdir, **kw):   # the real fine-tuning, counted
        finetunes.append(cell.hash)
        return real(cell, workdir, **kw)

    monkeypatch.setattr(execute, "execute_cell", execute_cell)
    path = base_path_for(ga, cells, store)
    assert finetunes == [ft.hash] and path == str(store.work_dir(ft.hash) / "finetuned_model")
    assert base_path_for(ga, cells, store) == path and finetunes == [ft.hash]   # then reused


def test_a_study_analysis_says_when_the_model_fine_tuned_again_is_not_the_recorded_one(tmp_path, monkeypatch):
    """On a GPU a second fine-tune need not give the recorded weights: the analysis still reads it, and says so."""
    from cru_harness.studies.run import base_path_for

    cells = tiny_finetune_plan(tmp_path)
    ft, _, ga = cells
    origin = {"cell": ft.hash, "fine_tuned_again": True, "matches_recorded": False}
    monkeypatch.setattr(execute.PlanExecutor, "finetuned_checkpoint", lambda self, cell, source: ("/x", origin))
    logged = []
    assert base_path_for(ga, cells, CellStore(tmp_path / "run"), logged.append) == "/x"
    assert len(logged) == 1 and "weights differ from those its finetune cell" in logged[0]
    origin["matches_recorded"] = True
    logged.clear()
    base_path_for(ga, cells, CellStore(tmp_path / "run"), logged.append)
    assert logged == []


def test_a_scoring_pass_out_of_gpu_memory_names_the_evaluation_batch_size(tmp_path, monkeypatch):
    """CUDA's out-of-memory error in lm-eval or in the failure classes' scoring is a cell's one-line reason naming
    `evaluation.batch_size`."""
    import lm_eval
    import torch

    from cru_harness.devices import GPUMemoryError
    from cru_harness.benchmarks.tofu import scoring as tofu_scoring
    from cru_harness.runner import evaluation

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total "
                                          "capacity of 139.80 GiB of which 3.50 GiB is free.")

    monkeypatch.setattr(lm_eval, "simple_evaluate", out_of_memory)
    with pytest.raises(GPUMemoryError, match=r"^lm-eval at batch size 64: CUDA out of memory \(GPU 0: 8\.00 GiB "
                                             r"asked, 3\.50 GiB of 139\.80 GiB free\); lower evaluation\.batch_size"):
        evaluation.run_lmeval(cfg.ModelSpec("m", "p", dtype="float32"), "/m", ["tofu_forget01"], tmp_path / "out",
                              batch_size=64)
    monkeypatch.setattr(tofu_scoring, "score_tofu_cell", out_of_memory)
    cell = next(c for c in tiny_finetune_plan(tmp_path) if c.kind != "finetune" and c.benchmark == "tofu")
    with pytest.raises(GPUMemoryError, match=r"^failure classes at batch size 8: CUDA out of memory .*; lower "
                                             r"evaluation\.batch_size in the config"):
        evaluation.score_cell(cell, tmp_path / "lmeval")
