"""Reproducibility: testbed builds independent of the thread count, cells keyed on the code that computed them,
and the comparison of a run with a reference (`runner.reproduce`).

The comparison tests use fake results written with `CellStore.write`: no model runs.
"""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cru_harness.cli import main
from cru_harness.runner import config as cfg
from cru_harness.runner import provenance
from cru_harness.store import CellStore
from cru_harness.runner.cli import run_config
from cru_harness.runner.loop import run_cells
from cru_harness.runner.plan import build_plan
from cru_harness.runner.reproduce import CROSS_THREAD, EXACT, compare_runs, tolerance_for, write_reproduction

# ------------------------------------------------------------------------------------------- testbed builds
# The smallest recipe that still runs the real build path: world -> tokenizer training -> model init ->
# fine-tuning -> save_pretrained. hidden_size 128 (the default) keeps the matmuls big enough to be split
# across threads.
BUILD_SCRIPT = """
import hashlib, json, sys
from pathlib import Path
import torch
from cru_harness.testbed.zoo import ModelRecipe, WorldRecipe, tiny_checkpoint, checkpoint_record
torch.set_num_threads(int(sys.argv[2]))
process = torch.get_num_threads()
path = tiny_checkpoint("llama", "finetuned", cache_dir=sys.argv[1],
                       recipe=ModelRecipe(n_layers=2, epochs=2, batch_size=8, max_length=64),
                       world=WorldRecipe(n_authors=4, qa_per_author=5, n_real_authors=4, n_world_facts=4))
files = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(Path(path).iterdir())
         if f.is_file() and f.name != "testbed_recipe.json"}
print(json.dumps({"files": files, "process": process, "after": torch.get_num_threads(),
                  "threads": checkpoint_record(path)["torch_threads"], "name": Path(path).name}))
"""


@pytest.mark.slow
def test_testbed_model_is_the_same_bytes_in_one_and_two_thread_processes(tmp_path):
    """Two builds of one recipe, each from an empty cache, in processes running 1 and 2 torch/OpenMP threads (and
    different Python hash seeds): every file of the checkpoint (weights, tokenizer, configs) is byte-identical,
    because the build runs one thread either way (on an AVX-512 CPU a two-thread build gave other weights) and
    gives the process its count back."""
    outputs = []
    for threads in (1, 2):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                   PYTHONHASHSEED=str(threads), TOKENIZERS_PARALLELISM="true")
        done = subprocess.run([sys.executable, "-c", BUILD_SCRIPT, str(tmp_path / f"cache{threads}"), str(threads)],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        outputs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    one, two = outputs
    assert (one["process"], two["process"]) == (1, 2) == (one["after"], two["after"])   # really ran at 1 and 2
    assert (one["threads"], two["threads"]) == (1, 1)          # the build's own count, recorded
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(one["files"])
    assert one["files"] == two["files"]
    assert one["name"] == two["name"]


# The demo's TOFU CRU cell, cut to its first epoch (5 router steps): at 2 threads MKL splits the long token
# dimension of the routers' weight-gradient GEMM across threads, which changed the bundle before
# `reductions.thread_invariant_outer_sum` (and the gate sums' `thread_invariant_sum`).
CRU_SCRIPT = """
import hashlib, json
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from cru_harness.cru import RouterTrainingConfig, train_routers
from cru_harness.data.corpora import load_corpus
from cru_harness.runner.models import resolve_data_dir, resolve_model_path
path = resolve_model_path("zoo:llama:finetuned")
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
tokenizer = AutoTokenizer.from_pretrained(path)
world = resolve_data_dir("testbed:world")
forget, retain = (load_corpus(split, world, tokenizer=tokenizer, chat=False, preset="open-unlearning")
                  for split in ("forget10", "retain90"))
config = RouterTrainingConfig(lam=1, percentile=95, d_r=32, lr=1e-2, epochs=1, input_norm="rms", progress=False)
bundle = train_routers(model, tokenizer, forget, retain, config)
weights = b"".join(t.numpy().tobytes() for _, t in sorted(bundle.state_dict().items()))
print(json.dumps({"weights": hashlib.sha256(weights).hexdigest(), "threads": torch.get_num_threads(),
                  "metrics": bundle.config.metrics}))
"""


@pytest.mark.slow
def test_cru_router_training_is_the_same_bits_at_one_and_two_threads(tmp_path):
    """The CRU bundle (router weights, gate means) of one training at 1 and at 2 torch/OpenMP threads."""
    from cru_harness.runner.models import resolve_model_path

    resolve_model_path("zoo:llama:finetuned")  # built (or found) here, so both runs only train
    outputs = []
    for threads in (1, 2):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        done = subprocess.run([sys.executable, "-c", CRU_SCRIPT], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        outputs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    one, two = outputs
    assert (one["threads"], two["threads"]) == (1, 2)
    assert one["weights"] == two["weights"]
    assert one["metrics"] == two["metrics"]


def test_testbed_cache_entry_is_keyed_on_the_code_that_builds_it(monkeypatch):
    from cru_harness.testbed import zoo

    recipe = zoo.ModelRecipe()
    before = zoo.recipe_hash(zoo.WorldRecipe(), recipe)
    monkeypatch.setattr(zoo, "builder_fingerprint", lambda: "other-builder-code")
    assert zoo.recipe_hash(zoo.WorldRecipe(), recipe) != before
    # and on the transformers that saved it: another version may not read its tokenizer back
    import transformers

    other_code = zoo.recipe_hash(zoo.WorldRecipe(), recipe)
    monkeypatch.setattr(transformers, "__version__", "4.56.2")
    assert zoo.recipe_hash(zoo.WorldRecipe(), recipe) != other_code


# ------------------------------------------------------------------------------------------- code version
def test_code_version_ignores_comments_but_not_code(tmp_path):
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text("def f(x):\n    return x + 1\n")
    b.write_text("# why: a comment\ndef f(x):\n\n    return x + 1  # another\n")
    c.write_text("def f(x):\n    return x + 2\n")
    assert provenance.file_digest("a.py", a) == provenance.file_digest("b.py", b)
    assert provenance.file_digest("a.py", a) != provenance.file_digest("c.py", c)


def test_code_version_covers_package_source_and_tasks_not_configs():
    names = set(provenance.code_files())
    assert "cru_harness/runner/loop.py" in names
    assert any(n.startswith("cru_harness/benchmarks/tofu/tasks/") and n.endswith(".yaml") for n in names)
    # the task templates (named *_yaml so lm-eval does not index them) set generation kwargs and metrics
    assert {"cru_harness/benchmarks/tofu/tasks/_default_template_yaml",
            "cru_harness/benchmarks/tofu/tasks/_forget_template_yaml",
            "cru_harness/benchmarks/rwku/tasks/_default_template_yaml"} <= names
    assert not any(n.startswith("cru_harness/configs/") or n.endswith("demo.yaml") for n in names)
    assert len(provenance.code_version()) == 16


# ------------------------------------------------------------------------------------------- stale cells
def small_config(tmp_path, out="run"):
    return cfg.validate_config({
        "name": "t", "output_dir": str(tmp_path / out), "seeds": [0],
        "models": [{"name": "m", "path": "zoo:llama", "retain": {"checkpoint": "zoo:llama:retain"}}],
        "benchmarks": {"tofu": {"splits": ["forget10"]}},
        "methods": [{"method": "GA", "lr": 1e-4}],
    })


def executor_with(metrics_by_kind, calls=None):
    def executor(cell, workdir):  # test double: no model
        if calls is not None:
            calls.append(cell.hash)
        return {"metrics": dict(metrics_by_kind.get(cell.kind, {"forget_rouge_l": 0.5})),
                "failure_classes": {"forget": {"degenerate": 0.25, "refusal": 0.0}}}
    return executor


def test_cell_computed_by_other_code_is_recomputed_own_run_resumes(tmp_path):
    config = small_config(tmp_path)
    cells = build_plan(config)
    store = CellStore(config.output_dir)
    run_cells(cells, store, executor_with({}), log=lambda *_: None)
    calls = []
    counts = run_cells(cells, store, executor_with({}, calls), log=lambda *_: None)
    assert calls == [] and counts["skipped"] == len(cells)           # resuming one's own run: nothing redone
    first = cells[0].hash
    record_path = store.cell_dir(first) / "run_record.json"
    record = json.loads(record_path.read_text())
    record["inputs"]["code_version"] = "0123456789abcdef"             # as if computed by other code
    record_path.write_text(json.dumps(record))
    logs = []
    counts = run_cells(cells, store, executor_with({}, calls), log=logs.append)
    assert calls == [first] and counts["stale"] == 1 and counts["skipped"] == len(cells) - 1
    assert any("another code_version; recomputing" in line for line in logs)
    assert json.loads(record_path.read_text())["inputs"]["code_version"] == provenance.code_version()


def test_directory_fingerprint_follows_the_weights_not_the_records(tmp_path):
    """A checkpoint's fingerprint hashes each file's path and bytes (sha256, by hand here); the fine-tuning record
    (wall times) and hidden files are left out; one changed byte of the weights changes it, within one process
    too (its cache is keyed by the files' sizes and mtimes)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    weights = ckpt / "model.safetensors"
    weights.write_bytes(bytes(64))
    (ckpt / "config.json").write_text("{}")
    by_hand = hashlib.sha256(b"config.json\0{}" + b"model.safetensors\0" + bytes(64)).hexdigest()[:16]
    assert provenance.directory_fingerprint(ckpt) == by_hand
    (ckpt / "finetune_record.json").write_text('{"train_wall_time_s": 12.5}')
    (ckpt / ".cache").mkdir()
    (ckpt / ".cache" / "lock").write_text("x")
    assert provenance.directory_fingerprint(ckpt) == by_hand
    stat = weights.stat()
    weights.write_bytes(bytes(63) + b"\x01")                       # same size
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))   # a later write
    assert provenance.directory_fingerprint(ckpt) != by_hand


def test_other_model_fingerprint_makes_a_cell_stale(tmp_path):
    config = small_config(tmp_path)
    cells = build_plan(config)[:1]
    store = CellStore(config.output_dir)
    inputs = {"code_version": "c", "models": {"model": "sha:aaaa"}}
    run_cells(cells, store, executor_with({}), inputs=lambda cell: inputs, log=lambda *_: None)
    calls = []
    run_cells(cells, store, executor_with({}, calls), inputs=lambda cell: {**inputs, "models": {"model": "sha:bbbb"}},
              log=lambda *_: None)
    assert calls == [cells[0].hash]


def test_a_method_input_file_is_an_input_other_content_recomputes_the_cell(tmp_path):
    """LUNAR's refusal prompts are named by path (the cell hash holds the path): another file at that path is another
    input, so the finished cell is recomputed; cells of methods that name no file carry no `files` input."""
    prompts = tmp_path / "harmful.json"
    prompts.write_text('["How do I pick a lock?"]')
    config = cfg.validate_config({
        "name": "t", "output_dir": str(tmp_path / "run"), "seeds": [0],
        "models": [{"name": "m", "path": "zoo:llama", "retain": {"checkpoint": "zoo:llama:retain"}}],
        "benchmarks": {"tofu": {"splits": ["forget10"]}},
        "methods": [{"method": "GA"}, {"method": "LUNAR", "refusal_prompts_path": str(prompts)}]})
    cells = build_plan(config)
    lunar = [c for c in cells if c.method == "LUNAR"]
    assert len(lunar) == 1 and all("files" not in provenance.cell_inputs(c) for c in cells if c.method != "LUNAR")
    assert provenance.cell_inputs(lunar[0])["files"] == {
        "refusal_prompts_path": "sha:" + hashlib.sha256(prompts.read_bytes()).hexdigest()[:16]}
    store = CellStore(config.output_dir)
    run_cells(cells, store, executor_with({}), inputs=provenance.cell_inputs, log=lambda *_: None)
    prompts.write_text('["How do I pick a lock?", "Write a phishing e-mail."]')
    calls, logs = [], []
    run_cells(cells, store, executor_with({}, calls), inputs=provenance.cell_inputs, log=logs.append)
    assert calls == [lunar[0].hash]
    assert any("another files; recomputing" in line for line in logs)


def fake_hub_cache(root: Path, repo_type: str, repo: str, sha: str, filename: str) -> None:
    """The layout huggingface_hub leaves after a download: refs/main names the snapshot the file sits in."""
    folder = root / f"{repo_type}s--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(sha)
    (folder / "snapshots" / sha).mkdir(parents=True)
    (folder / "snapshots" / sha / filename).write_text("{}")


def test_the_record_keeps_the_hub_revision_each_hub_input_resolved_to(tmp_path, monkeypatch):
    """Hub data and models are fingerprinted as "hub" / "hub:<id>" (nothing to hash before the download); the run
    record keeps the commit the local Hub cache resolved `main` to, so a dataset or model changed on the Hub is
    visible between two runs."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    fake_hub_cache(tmp_path / "hub", "dataset", "locuslab/TOFU", "a1" * 20, "README.md")
    fake_hub_cache(tmp_path / "hub", "model", "org/base", "b2" * 20, "config.json")
    inputs = {"code_version": "c", "data": "hub",
              "models": {"model": "hub:org/base", "retain": "hub:org/oracle", "purge": "sha:1234", "x": "hub:/gone"}}
    assert provenance.hub_revisions("tofu", inputs) == {
        "dataset:locuslab/TOFU": "a1" * 20, "dataset:open-unlearning/idk": "not in the Hub cache",
        "model:org/base": "b2" * 20, "model:org/oracle": "not in the Hub cache"}
    # Local data and local models name no Hub revision.
    assert provenance.hub_revisions("rwku", {"data": "sha:99", "models": {"model": "sha:1"}}) == {}
    # An unreadable cache is named, never raised: the cell has already run and its result is not yet written.
    import huggingface_hub

    def unreadable(*args, **kwargs):
        raise PermissionError("denied")

    with monkeypatch.context() as patched:
        patched.setattr(huggingface_hub, "try_to_load_from_cache", unreadable)
        assert provenance.hub_revisions("rwku", {"data": "hub"}) == {
            "dataset:jinzhuoran/RWKU": "unreadable Hub cache (denied)"}

    config = small_config(tmp_path)
    cells = build_plan(config)[:1]
    store = CellStore(config.output_dir)
    run_cells(cells, store, executor_with({}), inputs=lambda cell: inputs, log=lambda *_: None)
    record = json.loads((store.cell_dir(cells[0].hash) / "run_record.json").read_text())
    assert record["hub_revisions"]["dataset:locuslab/TOFU"] == "a1" * 20
    assert record["hub_revisions"]["model:org/base"] == "b2" * 20
    lines = provenance.provenance_lines([store.root])
    assert f"- Hub dataset:locuslab/TOFU: {'a1' * 6} (1 cell)" in lines
    assert "- Hub dataset:open-unlearning/idk: not in the Hub cache (1 cell)" in lines
    # Not among the inputs: the next run reuses the cell although the cache moved on.
    (tmp_path / "hub" / "datasets--locuslab--TOFU" / "refs" / "main").write_text("c3" * 20)
    calls = []
    run_cells(cells, store, executor_with({}, calls), inputs=lambda cell: inputs, log=lambda *_: None)
    assert calls == []


def test_undeterminable_inputs_recompute_instead_of_crashing(tmp_path):
    config = small_config(tmp_path)
    cells = build_plan(config)[:1]
    store = CellStore(config.output_dir)
    run_cells(cells, store, executor_with({}), log=lambda *_: None)

    def broken(cell):
        raise OSError("model directory vanished")

    calls = []
    counts = run_cells(cells, store, executor_with({}, calls), inputs=broken, log=lambda *_: None)
    assert calls == [cells[0].hash] and counts["stale"] == 1
    record = json.loads((store.cell_dir(cells[0].hash) / "run_record.json").read_text())
    assert "model directory vanished" in record["inputs"]["error"]


def test_only_a_checkout_that_tracks_the_package_names_a_commit(tmp_path):
    """An installed package inside some other repository (a venv in a project) must not record that repository's
    commit as its code's, clean, as if it were a checkout."""
    def git(cwd, *args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                              capture_output=True, text=True).stdout.strip()

    project = tmp_path / "project"
    installed = project / ".venv" / "lib" / "python3" / "site-packages" / "cru_harness"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("")
    (project / ".gitignore").write_text(".venv/\n")
    git(project, "init", "-q")
    git(project, "add", ".gitignore")
    git(project, "commit", "-qm", "x")
    assert provenance.checkout_state(installed) == {"commit": None, "dirty": None, "dirty_files": []}

    checkout = tmp_path / "checkout"
    (checkout / "cru_harness").mkdir(parents=True)
    (checkout / "cru_harness" / "__init__.py").write_text("")
    git(checkout, "init", "-q")
    git(checkout, "add", ".")
    git(checkout, "commit", "-qm", "x")
    state = provenance.checkout_state(checkout / "cru_harness")
    assert state["commit"] == git(checkout, "rev-parse", "HEAD") and state["dirty"] is False
    (checkout / "cru_harness" / "__init__.py").write_text("x = 1\n")
    assert provenance.checkout_state(checkout / "cru_harness")["dirty"] is True


def test_report_lists_stale_and_dirty_cells(tmp_path, monkeypatch):
    config = small_config(tmp_path)
    cells = build_plan(config)
    store = CellStore(config.output_dir)
    run_cells(cells, store, executor_with({}), log=lambda *_: None)
    for cell in cells:  # as computed from a clean checkout (this test may run in a dirty one)
        path = store.cell_dir(cell.hash) / "run_record.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "git": {"commit": "abc", "dirty": False}}))
    assert not any("another code version" in line or "dirty" in line
                   for line in provenance.provenance_lines([store.root]))
    record_path = store.cell_dir(cells[0].hash) / "run_record.json"
    record = json.loads(record_path.read_text())
    record.update(code_version="0123456789abcdef", git={"commit": "abc", "dirty": True})
    record["inputs"]["code_version"] = "0123456789abcdef"
    record_path.write_text(json.dumps(record))
    text = "\n".join(provenance.provenance_lines([store.root]))
    current = provenance.code_version()
    # what follows the checkout is on its one line (a committed report regenerates but for it); the cells' own
    # code versions, counted, on the lines below
    assert (f"This checkout's code version: {current}; 1 of {len(cells)} cells were computed by another code "
            "version (below)") in text
    assert f"- code version 0123456789abcdef (1 cell): commit abc + local changes" in text
    assert f"- code version {current} ({len(cells) - 1} cells): commit abc" in text
    assert "stale" not in text and "1 cells come from a dirty tree" in text
    assert cells[0].hash in text
    # a long list names the first cells and counts the rest (a 378-cell run's line stays readable)
    monkeypatch.setattr("cru_harness.reporting.provenance.LISTED", 1)
    for cell in cells:
        path = store.cell_dir(cell.hash) / "run_record.json"
        saved = json.loads(path.read_text())
        saved.update(code_version="0123456789abcdef", inputs={**saved["inputs"], "code_version": "0123456789abcdef"},
                     git={"commit": "abc", "dirty": True})
        path.write_text(json.dumps(saved))
    lines = provenance.provenance_lines([store.root])
    checkout = [line for line in lines if "code version" in line and current in line]
    assert checkout == [f"This checkout's code version: {current}; {len(cells)} of {len(cells)} cells were "
                        "computed by another code version (below): their numbers are what that code computed, and "
                        "running the config again with this checkout would recompute them."]
    (line,) = [line for line in lines if "dirty tree" in line]
    assert line.endswith(f"; and {len(cells) - 1} more") and sum(cell.hash in line for cell in cells) == 1


# ------------------------------------------------------------------------------------------- comparison
def make_run(tmp_path, out, metrics_by_kind, *, device="cpu", code_version=None, drop=()):
    """A finished run of `small_config` with the given metrics, written by the real loop and a fake executor."""
    config = small_config(tmp_path, out)
    cells = [c for c in build_plan(config) if c.kind not in drop]
    store = CellStore(config.output_dir)
    inputs = {"code_version": code_version or provenance.code_version()}
    run_cells(cells, store, executor_with(metrics_by_kind), inputs=lambda cell: inputs, log=lambda *_: None)
    if device != "cpu":
        for cell in cells:
            path = store.cell_dir(cell.hash) / "run_record.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), "device": device}))
    return store.root


METRICS = {"original": {"forget_rouge_l": 0.9, "forget_truth_ratio": 0.6, "forget_quality": 1e-5},
           "retain": {"forget_rouge_l": 0.4, "forget_truth_ratio": 0.7, "forget_quality": None},
           "method": {"forget_rouge_l": 0.3, "forget_truth_ratio": 0.65, "forget_quality": 0.014}}


def test_identical_runs_reproduce_exactly(tmp_path):
    reference = make_run(tmp_path, "ref", METRICS)
    run = make_run(tmp_path, "run", METRICS)
    comparison = write_reproduction(run, reference, log=lambda *_: None)
    assert comparison.reproduced
    assert comparison.verdict.startswith("REPRODUCED: all 3 cells") and "(exact: CPU)" in comparison.verdict
    # every metric and failure class of every cell was compared
    assert sum(c.n_numbers for c in comparison.cells) == 3 * (3 + 2)
    text = (Path(run) / "reproduction.md").read_text()
    assert comparison.verdict in text and "0 (exact)" in text
    assert json.loads((Path(run) / "reproduction.json").read_text())["reproduced"] is True


def _with_hub_revisions(root, revisions):
    for path in Path(root).glob("cells/*/run_record.json"):
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "hub_revisions": revisions}))


@pytest.mark.parametrize("reference, run, differ", [
    ({"dataset:locuslab/TOFU": "a1" * 20}, {"dataset:locuslab/TOFU": "c3" * 20}, True),
    ({"dataset:locuslab/TOFU": "a1" * 20}, {"dataset:locuslab/TOFU": "a1" * 20}, False),
    ({"dataset:locuslab/TOFU": "a1" * 20}, {"dataset:locuslab/TOFU": "not in the Hub cache"}, True),
    ({"dataset:locuslab/TOFU": "a1" * 20}, None, False),                  # one side recorded nothing: unknown
    ({"dataset:locuslab/TOFU": None}, {"dataset:locuslab/TOFU": "a1" * 20}, False),   # damaged: ignored
])
def test_another_hub_revision_is_named_among_the_inputs_that_differ(tmp_path, reference, run, differ):
    reference_dir = make_run(tmp_path, "ref", METRICS)
    run_dir = make_run(tmp_path, "run", METRICS)
    _with_hub_revisions(reference_dir, reference)
    if run is not None:
        _with_hub_revisions(run_dir, run)
    comparison = write_reproduction(run_dir, reference_dir, log=lambda *_: None)
    assert all(c.inputs_differ == (["hub_revisions"] if differ else []) for c in comparison.cells)
    assert ("| 0 | hub_revisions" in (Path(run_dir) / "reproduction.md").read_text()) == differ
    # a damaged record does not break the report either
    assert provenance.provenance_lines([reference_dir])


def test_a_damaged_target_choice_is_named_not_read_as_none(tmp_path):
    from cru_harness.errors import InputError
    from cru_harness.runner.targets import SELECTION_DIR

    reference = make_run(tmp_path, "ref", METRICS)
    run = make_run(tmp_path, "run", METRICS)
    (Path(run) / SELECTION_DIR).mkdir()
    (Path(run) / SELECTION_DIR / "m.json").write_text('{"chosen": [1')
    with pytest.raises(InputError, match="m.json: cannot read the RWKU target choice"):
        compare_runs(run, reference)


def test_a_difference_beyond_tolerance_is_named(tmp_path):
    reference = make_run(tmp_path, "ref", METRICS)
    changed = {**METRICS, "method": {**METRICS["method"], "forget_quality": 0.054}}
    comparison = compare_runs(make_run(tmp_path, "run", changed), reference)
    assert not comparison.reproduced
    assert comparison.verdict.startswith("NOT REPRODUCED: 1 of 3 cells differ beyond tolerance (1 numbers)")
    (diff,) = [d for c in comparison.cells for d in c.diffs]
    assert (diff.name, diff.reference, diff.value, diff.tolerance) == ("metrics.forget_quality", 0.014, 0.054, 0.0)
    assert "stale" not in comparison.verdict                       # same code: a real non-reproduction


def test_exact_means_exact_on_cpu_and_a_stated_tolerance_on_gpu(tmp_path):
    nudged = {k: {**v, "forget_truth_ratio": v["forget_truth_ratio"] + 1e-12} for k, v in METRICS.items()}
    cpu = compare_runs(make_run(tmp_path, "run", nudged), make_run(tmp_path, "ref", METRICS))
    assert cpu.count("differs") == 3
    gpu = compare_runs(make_run(tmp_path, "gpu", nudged, device="cuda"),
                       make_run(tmp_path, "gpu-ref", METRICS, device="cuda"))
    assert gpu.reproduced and "per-metric tolerances: GPU" in gpu.verdict
    assert tolerance_for("forget_truth_ratio", "cpu") is EXACT
    assert 0 < tolerance_for("forget_truth_ratio", "cuda").absolute < tolerance_for("forget_rouge_l", "cuda").absolute


def _set_threads(run_dir, threads):
    for path in Path(run_dir).glob("cells/*/run_record.json"):
        path.write_text(json.dumps({**json.loads(path.read_text()), "torch_threads": threads}))


@pytest.mark.parametrize("threads, notice", [((1, 2), False), ((2, 2), False), ((2, 4), True)])
def test_thread_counts_are_shown_and_unmeasured_ones_named(tmp_path, threads, notice):
    reference = make_run(tmp_path, "ref", METRICS)
    run = make_run(tmp_path, "run", METRICS)
    _set_threads(reference, threads[0])
    _set_threads(run, threads[1])
    write_reproduction(run, reference, log=lambda *_: None)
    text = (Path(run) / "reproduction.md").read_text()
    assert f"- torch threads, reference: {threads[0]}" in text
    assert f"- torch threads, this run: {threads[1]}" in text
    assert ("the cross-thread bound was measured at 1 and 2 threads" in text) is notice


@pytest.mark.parametrize("cpus, notice", [(("AVX2", "AVX2"), False), (("AVX2", "AVX512"), True)])
def test_cpu_instruction_sets_are_shown_and_a_difference_named(tmp_path, cpus, notice):
    # The forget01 fine-tune's weights differ between an AVX2 and an AVX-512 machine (docs/reproducibility.md).
    reference, run = make_run(tmp_path, "ref", METRICS), make_run(tmp_path, "run", METRICS)
    for root, cpu in zip((reference, run), cpus):
        for path in Path(root).glob("cells/*/run_record.json"):
            path.write_text(json.dumps({**json.loads(path.read_text()), "cpu_capability": cpu}))
    write_reproduction(run, reference, log=lambda *_: None)
    text = (Path(run) / "reproduction.md").read_text()
    assert f"- CPU instruction set, reference: {cpus[0]}" in text and f"- CPU instruction set, this run: {cpus[1]}" in text
    assert ("**the runs' CPUs use different instruction sets (AVX2, AVX512)**" in text) is notice


@pytest.mark.parametrize("threads, delta, reproduced", [((2, 2), 5e-7, False), ((1, 2), 5e-7, True),
                                                       ((1, 2), 1e-3, False), ((None, 2), 5e-7, False)])
def test_cpu_cells_at_other_thread_counts_get_the_measured_bound(tmp_path, threads, delta, reproduced):
    # Same thread count: exact. Different recorded counts: within CROSS_THREAD (MKL's small-row path), no wider.
    nudged = {k: {**v, "forget_truth_ratio": v["forget_truth_ratio"] + delta} for k, v in METRICS.items()}
    reference, run = make_run(tmp_path, "ref", METRICS), make_run(tmp_path, "run", nudged)
    _set_threads(reference, threads[0])
    _set_threads(run, threads[1])
    comparison = write_reproduction(run, reference, log=lambda *_: None)
    assert comparison.reproduced is reproduced
    if reproduced:
        assert "within 1e-06 across" in comparison.verdict
        assert "| the same, different thread counts | cpu | 1e-06 |" in (Path(run) / "reproduction.md").read_text()
    assert tolerance_for("forget_truth_ratio", "cpu", threads) is (
        CROSS_THREAD if None not in threads and threads[0] != threads[1] else EXACT)


def test_null_against_a_number_differs(tmp_path):
    reference = make_run(tmp_path, "ref", METRICS)
    changed = {**METRICS, "retain": {**METRICS["retain"], "forget_quality": 0.5}}
    comparison = compare_runs(make_run(tmp_path, "run", changed), reference)
    (diff,) = [d for c in comparison.cells for d in c.diffs]
    assert diff.reference is None and diff.value == 0.5


def test_rwku_target_choices_are_compared(tmp_path):
    reference = make_run(tmp_path, "ref", METRICS)
    run = make_run(tmp_path, "run", METRICS)
    for root, chosen in ((reference, [6, 2]), (run, [6, 3])):
        (Path(root) / "target_selection").mkdir()
        (Path(root) / "target_selection" / "m.json").write_text(json.dumps({"model": "m", "chosen": chosen}))
    comparison = write_reproduction(run, reference, log=lambda *_: None)
    assert comparison.selections == {"m": ([6, 2], [6, 3])}
    assert "reference [6, 2], this run [6, 3] (**differ**)" in (Path(run) / "reproduction.md").read_text()


def test_missing_cells_and_a_stale_reference_are_reported(tmp_path):
    reference = make_run(tmp_path, "ref", METRICS, code_version="0123456789abcdef")
    run = make_run(tmp_path, "run", METRICS, drop=("retain",))
    comparison = write_reproduction(run, reference, log=lambda *_: None)
    assert not comparison.reproduced
    assert "1 cells missing from the run" in comparison.verdict
    assert "3 reference cells were computed by other code (stale reference)" in comparison.verdict
    text = (Path(run) / "reproduction.md").read_text()
    assert "| missing |" in text and "code_version" in text


def test_run_reproduce_and_compare_cli(tmp_path, capsys):
    reference = make_run(tmp_path, "ref", METRICS)
    config = small_config(tmp_path, "again")
    status = run_config(config, executor=executor_with(METRICS), report=False, reproduce=reference,
                        log=lambda *_: None)
    assert status == 0 and (config.output_dir / "reproduction.md").is_file()
    other = make_run(tmp_path, "other", {**METRICS, "original": {**METRICS["original"], "forget_rouge_l": 0.8}})
    assert main(["compare", str(other), str(reference)]) == 1
    assert "NOT REPRODUCED: 1 of 3 cells differ" in capsys.readouterr().out
    with pytest.raises(ValueError, match="own output directory"):
        run_config(small_config(tmp_path, "ref"), executor=executor_with(METRICS), reproduce=reference)


def test_demo_never_computes_into_the_committed_results(tmp_path, monkeypatch, capsys):
    """`cru-harness demo` plans into results/demo-run and refuses an output directory that holds the reference."""
    monkeypatch.chdir(tmp_path)
    reference = make_run(tmp_path, "results/demo", METRICS)
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in Path(reference).rglob("*") if p.is_file()}
    assert main(["demo", "--dry-run"]) == 0
    assert "-> results/demo-run" in capsys.readouterr().out
    assert main(["demo", "--dry-run", "--output-dir", "results/demo"]) == 2
    assert "holds the results to compare with" in capsys.readouterr().err
    assert main(["demo", "--dry-run", "--reproduce", "no-such-run"]) == 2   # what the real run would meet
    assert "--reproduce no-such-run: no such run directory" in capsys.readouterr().err
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in Path(reference).rglob("*") if p.is_file()}
    assert after == before


def test_committed_demo_cells_come_from_a_committed_clean_tree():
    """Every committed demo cell was computed by committed code (issue 13: no number in the README from a run
    that cannot be re-run from the repository), and is a valid, finished cell."""
    demo = Path(__file__).resolve().parents[1] / "results" / "demo"
    store = CellStore(demo)
    records = sorted((demo / "cells").glob("*/run_record.json"))
    assert len(records) == 18
    versions = set()
    for path in records:
        record = json.loads(path.read_text())
        assert record["git"]["dirty"] is False, path
        assert record["status"] == "ok", path
        assert store.load_result(path.parent.name)["status"] == "ok", path
        versions.add(record["code_version"])
    assert len(versions) == 1  # one code version for the whole committed run


def test_each_cell_is_named_by_where_it_evaluates_and_the_finetune_cell_by_its_model(tmp_path):
    def run(out):
        raw = {"name": "t", "output_dir": str(tmp_path / out), "seeds": [0],
               "models": [{"name": "m", "path": "zoo:llama", "finetune": {"data": "full"}}],
               "benchmarks": {"tofu": {"splits": ["forget10"]}, "rwku": {"targets": [3]}},
               "methods": [{"method": "GA", "lr": 1e-4}]}
        config = cfg.validate_config(raw)
        cells = build_plan(config)
        run_cells(cells, CellStore(config.output_dir), executor_with(METRICS), log=lambda *_: None)
        return config.output_dir, {cell.describe() for cell in cells}

    (run_dir, logged), (reference, _) = run("run"), run("ref")
    comparison = compare_runs(run_dir, reference)
    assert {c.cell for c in comparison.cells} == logged == {
        "m | rwku target3 | GA seed=0", "m | rwku target3 | Original", "m | tofu | Finetune seed=0",
        "m | tofu forget10 | GA seed=0", "m | tofu forget10 | Original"}


def test_the_verdict_names_the_code_of_the_runs_cells_not_of_the_process_comparing(tmp_path):
    """A comparison run later, by other code, still names the code and commit the run's cells were computed by
    (a verdict once named the comparing checkout's commit as the run's)."""
    reference = make_run(tmp_path, "ref", METRICS, code_version="a" * 16)
    run = make_run(tmp_path, "run", METRICS, code_version="b" * 16)
    for path in Path(run).glob("cells/*/run_record.json"):
        path.write_text(json.dumps({**json.loads(path.read_text()), "git": {"commit": "c0ffee", "dirty": False}}))
    comparison = write_reproduction(run, reference, log=lambda *_: None)
    assert comparison.run_code_versions == ["b" * 16] and comparison.run_commits == ["c0ffee"]
    text = (Path(run) / "reproduction.md").read_text()
    assert f"- this run's cells: code version(s) {'b' * 16}; commit(s) c0ffee" in text
    assert f"- compared by code version {provenance.code_version()}" in text


def test_an_attack_waits_for_its_attacked_cell_while_another_shard_computes_it(tmp_path):
    """Shards of one run share its directory: an attack cell whose attacked cell another live process of this host
    is computing waits for that result instead of failing; a marker left by a dead process is not waited on."""
    import threading

    store = CellStore(tmp_path / "run")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (store.cell_dir("ab" * 8)).mkdir(parents=True)
        marker = store.cell_dir("ab" * 8) / "RUNNING"
        marker.write_text(json.dumps({"pid": other.pid, "host": __import__("socket").gethostname()}))
        assert store.running_elsewhere("ab" * 8)["pid"] == other.pid
        result = {"hash": "ab" * 8, "status": "ok", "kind": "method", "label": "GA", "model": "m", "benchmark": "tofu",
                  "metrics": {}}
        timer = threading.Timer(0.3, lambda: store.write("ab" * 8, result, {"hash": "ab" * 8, "status": "ok"}))
        timer.start()
        said = []
        got = store.wait_while_running_elsewhere("ab" * 8, log=said.append, poll_s=0.05)
        assert got["status"] == "ok" and said == [f"waiting for cell {'ab' * 8}, which process {other.pid} is computing"]
    finally:
        other.kill()
        other.wait()
    marker.write_text(json.dumps({"pid": other.pid, "host": __import__("socket").gethostname()}))   # now dead
    assert store.running_elsewhere("ab" * 8) is None
    marker.write_text(json.dumps({"pid": os.getpid(), "host": __import__("socket").gethostname()}))   # this one
    assert store.running_elsewhere("ab" * 8) is None


def test_a_shards_attack_cell_runs_once_the_other_shard_finishes_the_cell_it_attacks(tmp_path, monkeypatch):
    """The runner's executor waits on the store (above) instead of failing the attack cell."""
    import threading

    from cru_harness.runner import execute

    config = cfg.validate_config({**small_config(tmp_path).raw, "attacks": ["identity"]})
    cells = build_plan(config)
    ga = next(c for c in cells if c.label == "GA")
    attack = next(c for c in cells if c.label == "GA + identity")
    store = CellStore(config.output_dir)
    store.cell_dir(ga.hash).mkdir(parents=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    seen = {}
    monkeypatch.setattr(execute, "execute_cell", lambda cell, workdir, **kw: seen.update(kw) or {})
    waits = CellStore.wait_while_running_elsewhere
    monkeypatch.setattr(CellStore, "wait_while_running_elsewhere",
                        lambda self, cell_hash, log=None: waits(self, cell_hash, log=log, poll_s=0.05))
    try:
        (store.cell_dir(ga.hash) / "RUNNING").write_text(
            json.dumps({"pid": other.pid, "host": __import__("socket").gethostname()}))
        result = {"hash": ga.hash, "status": "ok", "kind": "method", "label": "GA", "model": "m", "benchmark": "tofu",
                  "metrics": {}, "artifacts": {"model": "zoo:llama"}}
        threading.Timer(0.3, lambda: store.write(ga.hash, result, {"hash": ga.hash, "status": "ok"})).start()
        execute.PlanExecutor(store, cells, log=lambda *_: None)(attack, tmp_path / "w")
    finally:
        other.kill()
        other.wait()
    assert seen["attacked_result"]["label"] == "GA"
