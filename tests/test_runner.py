"""Runner machinery: config validation, plan/hashing, cache + resume, shards, PURGE resolution, dry runs.

Fake executors below are test doubles (no model is loaded); the real executor is `runner.execute.execute_cell`.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cru_harness import plugins
from cru_harness.errors import InputError, MissingInputError
from cru_harness.runner import config as cfg
from cru_harness.store import CellStore, load_results
from cru_harness.runner.loop import CellUnavailable, run_cells
from cru_harness.runner.plan import build_plan
from cru_harness.benchmarks.rwku.purge import purge_candidates, resolve_purge_checkpoint
from cru_harness.runner.shard import parse_shard, select_shard

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def base_config(tmp_path, **extra):
    raw = {
        "name": "t", "output_dir": str(tmp_path / "run"), "seeds": [0, 1],
        "models": [{"name": "m", "path": "zoo:llama", "retain": {"checkpoint": "zoo:llama:retain"}}],
        "benchmarks": {"tofu": {"splits": ["forget01", "forget10"]}},
        "methods": [{"method": "GA", "lr": 1e-4}, {"method": "CRU", "lambda": 1, "percentile": 95}],
    }
    raw.update(extra)
    return raw


# ------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("mutate, key, words", [
    (lambda r: r["methods"].append({"method": "CRU", "label": "CRU2", "lrr": 1}), "methods[2].lrr", "did you mean"),
    (lambda r: r.update(benchmarks={"rwku": {"targets": [1]}}, models=[{"path": "smollm2"}],
                        methods=[{"method": "GA"}, {"method": "NPO"},
                                                                       {"method": "ICU", "lr": 1e-5}]),
     "methods[2].lr", "prompt-only"),
    (lambda r: r["methods"].append({"method": "PURGE"}), "methods[2].method", "RWKU-only"),
    (lambda r: r["models"][0].update(finetune={"data": "{retain_split}"}), "models[0].finetune.data",
     "trains once, on one corpus"),
    (lambda r: r["benchmarks"]["tofu"].update(splits=["forget02"]), "benchmarks.tofu.splits[0]", "forget01"),
    (lambda r: r["benchmarks"].update(rwku={"targets": "1-201"}), "benchmarks.rwku.targets", "1 to 200"),
    (lambda r: r["benchmarks"].update(rwku={"targets": [0, 5]}), "benchmarks.rwku.targets", "out of range"),
    (lambda r: r.update(colour="red"), "colour", "unknown key"),
    (lambda r: r["models"][0].update(revison="x"), "models[0].revison", "unknown key"),
    (lambda r: r["methods"][0].update(alpha=1.0), "methods[0].alpha", "no retain term"),
    (lambda r: r["methods"][1].update(percentile=120), "methods[1].percentile", "must be < 100"),
    (lambda r: r["methods"].append({"method": "GA"}), "methods[2].label", "already used"),
    (lambda r: r["methods"].append({"method": "FOO"}), "methods[2].method", "unknown method"),
    (lambda r: r["models"][0].update(retain={"forget05": {"checkpoint": "x"}}), "models[0].retain.forget05",
     "configured TOFU split"),
    (lambda r: r["benchmarks"]["tofu"].update(tasks=["tofu_{target}"]), "benchmarks.tofu.tasks[0]", "placeholder"),
    (lambda r: r.update(evaluation={"tofu_preset": "tofu2"}), "evaluation", "valid: open-unlearning, legacy"),
    (lambda r: r.update(evaluation={"tofu_preset": "legacy"}), "evaluation", "valid: llama2-7b, phi, stablelm"),
    (lambda r: r.update(evaluation={"rwku_preset": "paper"}), "evaluation", "valid: reference"),
    (lambda r: r.update(evaluation={"tofu_model_family": "llama2-7b"}), "evaluation",
     "valid: Llama-2-7b-chat-hf, Llama-2-7b-hf, Llama-2-13b-hf, phi-1_5"),

    # bounds a trained cell would otherwise hit only after its models were built
    (lambda r: r["methods"][0].update(num_epochs=0), "methods[0].num_epochs", "must be >= 1, got 0"),
    (lambda r: r["methods"][0].update(lr=0), "methods[0].lr", "must be > 0, got 0"),
    (lambda r: r["methods"][1].update(percentile=0), "methods[1].percentile", "must be > 0, got 0"),
    (lambda r: r["methods"][0].update(adam_betas=[0.9, 1.0]), "methods[0].adam_betas", "two numbers in [0, 1)"),
    (lambda r: r.update(seeds=[0, -1]), "seeds[1]", "must be an integer from 0 to 2**32 - 1, got -1"),
    (lambda r: r.update(seeds=[2**32]), "seeds[0]", "must be an integer from 0 to 2**32 - 1"),
    # the keys' own rules, declared in runner.schema: the same lines as when they were hand-written
    (lambda r: r.update(name="a b"), "name", "expected a simple name (letters, digits, _ . -), got 'a b'"),
    (lambda r: r.update(output_dir=" "), "output_dir", "expected a directory path, got ' '"),
    (lambda r: r.update(data_dir=3), "data_dir", "expected a path, got 3"),
    (lambda r: r.update(seeds=[1, 1]), "seeds", "repeats a seed: [1, 1]"),
    (lambda r: r.update(seeds=[]), "seeds", "expected a non-empty list of integers, got []"),
    (lambda r: r["models"][0].update(dtype="fp8"), "models[0].dtype", "expected one of auto, float32, "),
    (lambda r: r["models"][0].update(eval_dtype="fp8"), "models[0].eval_dtype", "got 'fp8'"),
    (lambda r: r["models"][0].update(device_map="balanced"), "models[0].device_map",
     "expected auto (shard over the visible GPUs) or null, got 'balanced'"),
])
def test_config_errors_name_the_key(tmp_path, mutate, key, words):
    raw = base_config(tmp_path)
    mutate(raw)
    with pytest.raises(cfg.ConfigError) as info:
        cfg.validate_config(raw)
    assert info.value.key == key, str(info.value)
    assert str(info.value).startswith(key + ":")
    assert words in str(info.value)


def test_purge_needs_phi_and_targets_1_to_20(tmp_path):
    raw = base_config(tmp_path, benchmarks={"rwku": {"targets": "1-21"}},
                      models=[{"name": "phi", "path": "microsoft/Phi-3-mini-4k-instruct"}],
                      methods=[{"method": "PURGE"}])
    with pytest.raises(cfg.ConfigError, match=r"benchmarks.rwku.targets: .*\[21\]"):
        cfg.validate_config(raw)
    raw["benchmarks"]["rwku"]["targets"] = "1-2"
    raw["models"] = [{"name": "smol", "path": "smollm2"}]
    with pytest.raises(cfg.ConfigError, match=r"models\[0\].path: PURGE"):
        cfg.validate_config(raw)
    raw["methods"] = [{"method": "PURGE", "checkpoints": {1: "/x", 2: "/y"}}]   # local stand-ins for every target
    config = cfg.validate_config(raw)
    purge = [c for c in build_plan(config) if c.method == "PURGE"]
    assert [c.extra["purge_local_checkpoint"] for c in purge] == ["/x", "/y"]
    assert not any("checkpoints" in c.hparams for c in purge)
    with pytest.raises(cfg.ConfigError, match=r"methods\[0\]\.checkpoints\.21: PURGE checkpoints exist for RWKU "
                                              r"targets 1-20 only"):
        cfg.validate_config({**raw, "methods": [{"method": "PURGE", "checkpoints": {21: "/z"}}]})


def test_an_old_configs_purge_checkpoints_still_reads_naming_the_new_key(tmp_path, capsys):
    """`purge_checkpoints:` at the top (before the checkpoints joined PURGE's entry) plans the same cells, same hashes,
    with one line naming the new key."""
    raw = base_config(tmp_path, benchmarks={"rwku": {"targets": "1-2"}}, models=[{"name": "smol", "path": "smollm2"}],
                      methods=["PURGE"])
    new = cfg.validate_config({**raw, "methods": [{"method": "purge", "checkpoints": {1: "/x", 2: "/y"}}]})
    capsys.readouterr()
    old = cfg.validate_config({**raw, "purge_checkpoints": {1: "/x", 2: "/y"}})
    assert capsys.readouterr().err.strip() == ("note: config: `purge_checkpoints` is now PURGE's method entry key "
                                               "`checkpoints`; read as methods[0].checkpoints")
    assert [(c.hash, c.extra) for c in build_plan(old)] == [(c.hash, c.extra) for c in build_plan(new)]
    assert "purge_checkpoints" in old.raw   # plan.json keeps the config as written
    from cru_harness.runner.cli import security_summary

    assert [(e["key"], e["name"], e["path"]) for e in security_summary(old) if "checkpoints" in e["key"]] == [
        ("methods[0].checkpoints.1", "PURGE target 1", "/x"), ("methods[0].checkpoints.2", "PURGE target 2", "/y")]
    with pytest.raises(cfg.ConfigError, match=r"methods\[0\]\.checkpoints\.x: keys are RWKU target indices"):
        cfg.validate_config({**raw, "purge_checkpoints": {"x": "/x"}})


def test_static_hparams_match_the_dataclasses():
    """The config's hyperparameter lists mirror the baselines' and CRU's config dataclasses (no drift)."""
    import dataclasses

    from cru_harness.baselines.registry import get_method
    from cru_harness.cru.train import RouterTrainingConfig

    for name in ("GA", "GD", "NPO", "SimNPO", "IdkDPO"):
        fields = {f.name for f in dataclasses.fields(get_method(name).Config)}
        # and `lora`, the engine's option every weight-training method takes (training.lora.LoraSettings)
        assert set(cfg.method_plugin(name).hparams()) == fields | {"lora"}, name
    runner_set = {"seed", "forget_description", "retain_description", "progress"}
    fields = {f.name for f in dataclasses.fields(RouterTrainingConfig)} - runner_set
    assert set(cfg.method_plugin("CRU").hparams()) == fields


def test_config_bounds_agree_with_the_dataclasses():
    """A hyperparameter value the config accepts is one the method's dataclass accepts, so no cell fails on it after
    its models were built; the baselines' dataclass reads the config's own table, so for them the reverse holds
    too (a config never refuses what the Python API takes)."""
    from cru_harness.baselines.registry import get_method
    from cru_harness.cru.train import RouterTrainingConfig
    from cru_harness.errors import InputError

    def config_accepts(method, key, value):
        raw = {"name": "t", "models": [{"name": "m", "path": "zoo:llama"}], "benchmarks": {"tofu": {}},
               "methods": [{"method": method, key: value}]}
        try:
            return cfg.validate_config(raw).methods[0].hparams[key]
        except cfg.ConfigError as err:
            assert err.key == f"methods[0].{key}", str(err)
            return "refused"

    def dataclass_accepts(klass, key, value):
        try:
            klass(**{key: value})
            return True
        except InputError:
            return False

    probes = [-1, 0, 1e-9, 0.5, 1, 2.5, 7, 8, 99.5, 100, 2**40, float("nan"), None, [0.9, 0.999], [0.9, 1]]
    for name in ("GA", "GD", "NPO", "SimNPO", "IdkDPO", "CRU"):
        klass = RouterTrainingConfig if name == "CRU" else get_method(name).Config
        numeric = [k for k in cfg.method_plugin(name).hparams() if k in cfg.HPARAM_BOUNDS or k == "adam_betas"]
        assert numeric, name
        for key in numeric:
            for value in probes:
                accepted = config_accepts(name, key, value)
                if accepted != "refused":
                    assert dataclass_accepts(klass, key, accepted), (name, key, value)
                elif name != "CRU":
                    assert not dataclass_accepts(klass, key, value), (name, key, value)


def test_one_seed_rule_for_configs_and_commands(tmp_path):
    from cru_harness.errors import InputError

    for seed in (0, 2**32 - 1):
        assert cfg.validate_config(base_config(tmp_path, seeds=[seed])).seeds == (seed,)
        assert cfg.check_seed(seed) == seed
    for seed in (-1, 2**32, 10**23, 1.5, True):
        with pytest.raises(cfg.ConfigError, match=r"seeds\[0\]: must be an integer from 0 to 2\*\*32 - 1"):
            cfg.validate_config(base_config(tmp_path, seeds=[seed]))
        with pytest.raises(InputError, match=r"^--seed must be an integer from 0 to 2\*\*32 - 1"):
            cfg.check_seed(seed)


# ------------------------------------------------------------------------------------------- plan + hashing
def test_plan_cells_and_hashes(tmp_path):
    config = cfg.validate_config(base_config(tmp_path))
    cells = build_plan(config)
    # per split: Original + Retain + GA x 2 seeds + CRU x 2 seeds
    assert len(cells) == 2 * (2 + 2 + 2)
    hashes = [c.hash for c in cells]
    assert len(set(hashes)) == len(hashes)
    assert cells[2].tasks == ("tofu_forget01", "tofu_retain", "tofu_real_authors", "tofu_world_facts",
                              "tofu_privacy_forget01")   # TOFU's default tasks, the privacy block included
    assert cells[2].corpora == {"forget_corpus": "forget01", "retain_corpus": "retain99"}
    # same config -> same hashes; a changed hyperparameter changes only that method's cells
    again = [c.hash for c in build_plan(cfg.validate_config(base_config(tmp_path)))]
    assert again == hashes
    raw = base_config(tmp_path)
    raw["methods"][1]["percentile"] = 90
    changed = {c.hash for c in build_plan(cfg.validate_config(raw))}
    assert {c.hash for c in cells if c.method != "CRU"} <= changed
    assert not {c.hash for c in cells if c.method == "CRU"} & changed


def test_a_cru_cell_without_a_setting_takes_the_papers_setting_of_its_benchmark(tmp_path):
    """RWKU's CRU cells get the paper's RWKU setting (lambda 50, p 90, d_r 256) where the config leaves it unset, in
    their hparams (so in their hashes); a stated value wins, and TOFU cells keep RouterTrainingConfig's defaults."""
    from cru_harness.cru.train import RouterTrainingConfig

    raw = base_config(tmp_path, benchmarks={"tofu": {"splits": ["forget01"]}, "rwku": {"targets": [1]}})
    raw["methods"][1] = {"method": "CRU", "percentile": 85}
    cells = {c.benchmark: c for c in build_plan(cfg.validate_config(raw)) if c.method == "CRU" and c.seed == 0}
    assert cells["rwku"].hparams == {"lam": 50, "percentile": 85, "d_r": 256}
    assert cells["tofu"].hparams == {"percentile": 85}
    config = RouterTrainingConfig(**cells["rwku"].hparams)
    assert (config.lam, config.percentile, config.d_r) == (50, 85, 256)
    # every key names a RouterTrainingConfig field, and the TOFU setting is the dataclass's own
    cru = cfg.method_plugin("CRU")
    assert not plugins.benchmarks.get("tofu").method_settings("CRU", "forget01") and not cru.benchmark_defaults
    assert set(plugins.benchmarks.get("rwku").method_settings("CRU", None)) <= set(cru.hparams())
    tofu = RouterTrainingConfig()
    assert (tofu.lam, tofu.percentile, tofu.d_r) == (1.0, 95.0, 32)


def test_a_tofu_model_family_fixes_the_tofu_cells_format_and_leaves_rwku_on_the_chat_template(tmp_path):
    """open-unlearning's Llama-2-7b-chat config writes `[INST] q [/INST]`, not the chat template: the runner
    trains and evaluates the TOFU cells that way (no --apply_chat_template), while RWKU keeps the template."""
    from cru_harness.runner.prompting import use_chat_template
    from cru_harness.runner.prompting import prompt_format

    raw = base_config(tmp_path, evaluation={"tofu_model_family": "Llama-2-7b-chat-hf"})
    raw["models"][0]["chat_template"] = True
    raw["benchmarks"]["rwku"] = {"targets": [1]}
    cells = [c for c in build_plan(cfg.validate_config(raw)) if c.method == "GA"]
    by_bench = {c.benchmark: c for c in cells}
    tofu, rwku = by_bench["tofu"], by_bench["rwku"]
    def training_rows(cell):   # what the trainers pass the prompt builder
        return prompt_format(cell, use_chat_template(cell, "unused"))

    assert use_chat_template(tofu, "unused") is False
    assert training_rows(tofu) == {"chat": False, "preset": "open-unlearning", "family": "Llama-2-7b-chat-hf"}
    assert use_chat_template(rwku, "unused") is True
    assert training_rows(rwku) == {"chat": True, "benchmark": "rwku"}   # RWKU's probes ask its question rows
    # the model it starts from is fine-tuned in the same format (the finetune cell carries the family)
    raw["models"][0]["finetune"] = {"data": "full", "epochs": 1}
    finetune = next(c for c in build_plan(cfg.validate_config(raw)) if c.kind == "finetune")
    assert finetune.evaluation == {"tofu_model_family": "Llama-2-7b-chat-hf"}
    assert training_rows(finetune) == {"chat": False, "preset": "open-unlearning", "family": "Llama-2-7b-chat-hf"}
    # a config at the default presets leaves its finetune cell as it was: the committed run's cell, by hash
    committed = next(c for c in build_plan(cfg.load_config(REPO / "configs" / "cpu_smollm2.yaml"))
                     if c.kind == "finetune")
    assert committed.evaluation == {} and (REPO / "results" / "cpu_smollm2" / "cells" / committed.hash).is_dir()
    # without a family the TOFU cells follow the model's chat template as before
    plain = [c for c in build_plan(cfg.validate_config(base_config(tmp_path, models=[
        {"name": "m", "path": "zoo:llama", "chat_template": True, "retain": {"checkpoint": "zoo:llama:retain"}}])))
        if c.method == "GA"][0]
    assert use_chat_template(plain, "unused") is True


def test_the_plan_settles_each_cells_decisions_once_outside_its_hash(tmp_path, monkeypatch):
    """The plan attaches each cell's decisions (presets, lm-eval settings, task metadata, rows' format); execution
    reads them, and an automatic chat choice reads a checkpoint's tokenizer once, however often it is asked."""
    import dataclasses

    import transformers

    from cru_harness.runner.prompting import decide, decisions_of, lmeval_settings, prompt_format, use_chat_template

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "tokenizer_config.json").write_text("{}")
    raw = base_config(tmp_path, models=[{"name": "m", "path": str(model_dir)}])
    cells = build_plan(cfg.validate_config(raw))
    cell = next(c for c in cells if c.method == "GA")
    assert dataclasses.replace(cell.decisions, linked=False) == decide(cell)   # no oracle, no fine-tune here
    assert cell.decisions.linked and (cell.decisions.oracle, cell.decisions.starts_from) == (None, None)
    assert cell.decisions.lmeval_settings == lmeval_settings(cell.evaluation)
    assert cell.decisions.task_metadata == plugins.benchmarks.get("tofu").task_metadata(cell.split, cell.target)
    bare = dataclasses.replace(cell)   # neither the hash nor equality sees the decisions; a copy is decided again
    assert (bare.hash, bare) == (cell.hash, cell) and bare.decisions is not cell.decisions
    assert not bare.decisions.linked and bare.decisions is bare.decisions   # decided once, when first asked
    changed = dataclasses.replace(cell, evaluation={**cell.evaluation, "max_gen_toks": 7})
    assert lmeval_settings(changed.evaluation)["gen_kwargs"] == {"max_gen_toks": 7}
    assert decisions_of(changed).gen_kwargs == {"max_gen_toks": 7}   # not the planned cell's
    reads = []

    class Tokenizer:
        chat_template = "{{ messages }}"

    def from_pretrained(path, **kwargs):
        reads.append(path)
        return Tokenizer()

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    for _ in range(3):   # the trainers, the evaluation and the logit lens each ask
        assert use_chat_template(cell, str(model_dir)) is True
        assert prompt_format(cell, True)["chat"] is True
    assert reads == [str(model_dir)]
    (model_dir / "tokenizer_config.json").write_text('{"rewritten": true}')   # a checkpoint written again
    os.utime(model_dir / "tokenizer_config.json", ns=(1, 1))
    assert use_chat_template(cell, str(model_dir)) is True and len(reads) == 2


def test_the_plan_settles_the_cells_each_cell_reads_and_the_executor_reads_them(tmp_path, monkeypatch):
    """A cell's oracle (Forget Quality, the reference attack) and the fine-tune its model starts from are found once,
    when the plan is built (`plan.settle`, by hash); the executor reads them instead of searching the plan."""
    from cru_harness.runner import execute, plan

    raw = base_config(tmp_path, seeds=[0])
    raw["models"][0]["finetune"] = {"data": "full", "epochs": 1}
    cells = build_plan(cfg.validate_config(raw))
    by_kind = {}
    for cell in cells:
        by_kind.setdefault(cell.kind, []).append(cell)
    (finetune,) = by_kind["finetune"]
    for cell in by_kind["method"] + by_kind["original"]:
        oracle = plan.retain_cell_for(cell, cells)
        assert cell.decisions.oracle == oracle.hash and oracle.split == cell.split
        assert cell.decisions.starts_from == finetune.hash == plan.finetune_cell_for(cell, cells).hash
        assert cell.decisions.oracle_reference   # TOFU's privacy tasks read the oracle's checkpoint
    for cell in by_kind["retain"]:
        assert cell.decisions.oracle is None and cell.decisions.starts_from == finetune.hash
        assert not cell.decisions.oracle_reference
    assert finetune.decisions.oracle is None and finetune.decisions.starts_from is None
    ga = next(c for c in by_kind["method"] if c.method == "GA")
    assert ga.decisions.method is plugins.methods.get("GA") and finetune.decisions.method is None

    def no_search(*args):
        raise AssertionError("the executor searched the plan")

    monkeypatch.setattr(plan, "retain_cell_for", no_search)
    monkeypatch.setattr(plan, "finetune_cell_for", no_search)
    seen = {}

    def finetuned_checkpoint(self, cell, source):
        seen["source"] = source.hash
        return "/x", {}

    monkeypatch.setattr(execute.PlanExecutor, "finetuned_checkpoint", finetuned_checkpoint)
    monkeypatch.setattr(execute, "execute_cell", lambda cell, workdir, **kw: seen.update(kw) or {})
    store = CellStore(tmp_path / "store")
    monkeypatch.setattr(store, "load_result", lambda key: {"status": "ok", "hash": key} if key == ga.decisions.oracle
                        else None)
    execute.PlanExecutor(store, cells)(ga, tmp_path / "w")
    assert seen["source"] == finetune.hash and seen["retain_result"]["hash"] == ga.decisions.oracle
    assert seen["base_path"] == "/x"
    # a cell whose fine-tune is not in the executor's plan is refused, never run on the base model instead
    seen.clear()
    with pytest.raises(RuntimeError, match=f"starts from the fine-tune cell {finetune.hash}, which is not in the plan"):
        execute.PlanExecutor(store, [c for c in cells if c.kind != "finetune"])(ga, tmp_path / "w2")
    assert seen == {}


# ------------------------------------------------------------------------------------------- cache + resume
class Killed(BaseException):
    """Simulates the process being killed (not an Exception: the runner must not record it as a result)."""


def fake_executor(calls, kill_at=None):
    def executor(cell, workdir):  # test double: no model
        calls.append(cell.hash)
        (workdir / "partial.txt").write_text("half")
        if kill_at is not None and len(calls) == kill_at:
            raise Killed()
        return {"metrics": {"forget_rouge_l": 0.5, "model_utility": 0.4}, "resources": {"trainable_params": 7}}
    return executor


def test_resume_after_kill_recomputes_nothing_finished(tmp_path):
    config = cfg.validate_config(base_config(tmp_path))
    cells = build_plan(config)
    store = CellStore(config.output_dir)
    calls = []
    with pytest.raises(Killed):
        run_cells(cells, store, fake_executor(calls, kill_at=2), log=lambda *_: None)
    first, second = cells[0].hash, cells[1].hash
    assert store.is_finished(first) and not store.is_finished(second)
    assert store.was_interrupted(second)
    saved = (store.cell_dir(first) / "result.json").read_bytes()
    record = json.loads((store.cell_dir(first) / "run_record.json").read_text())
    assert record["resolved_config"]["model"]["path"] == "zoo:llama"
    assert "torch" in record["libraries"] and "commit" in record["git"] and record["code_version"]
    assert record["inputs"] == {"code_version": record["code_version"]}

    calls2 = []
    counts = run_cells(cells, store, fake_executor(calls2), log=lambda *_: None)
    assert first not in calls2 and calls2[0] == second       # finished cell not recomputed, killed one redone
    assert calls2 == [c.hash for c in cells[1:]]
    assert counts == {"skipped": 1, "stale": 0, "ok": len(cells) - 1, "failed": 0, "unavailable": 0}
    assert (store.cell_dir(first) / "result.json").read_bytes() == saved   # nothing lost or rewritten
    assert len(load_results(config.output_dir)) == len(cells)
    assert not list(store.cells_dir.glob("*/RUNNING"))
    assert not list(store.cells_dir.glob("*/.*.tmp"))
    # a third run does nothing
    calls3 = []
    assert run_cells(cells, store, fake_executor(calls3), log=lambda *_: None)["skipped"] == len(cells)
    assert calls3 == []


def test_failed_and_unavailable_cells_are_recorded_not_raised(tmp_path):
    config = cfg.validate_config(base_config(tmp_path))
    cells = build_plan(config)[:3]
    store = CellStore(config.output_dir)

    def executor(cell, workdir):  # test double
        if cell.kind == "original":
            raise CellUnavailable("checkpoint not published", {"tried": ["a/b"]})
        if cell.kind == "retain":
            raise RuntimeError("boom")
        return {"metrics": {}}

    counts = run_cells(cells, store, executor, log=lambda *_: None)
    assert counts == {"skipped": 0, "stale": 0, "ok": 1, "failed": 1, "unavailable": 1}
    results = {r["kind"]: r for r in load_results(config.output_dir)}
    assert results["original"]["status"] == "unavailable" and results["original"]["reason"] == "checkpoint not published"
    assert results["retain"]["status"] == "failed" and "boom" in results["retain"]["error"]
    for r in results.values():
        assert {"wall_time_s", "cell_wall_time_s"} & set(r["resources"]) and "cell_peak_rss_bytes" in r["resources"]
    # on a re-run, only the ok cell is skipped
    assert run_cells(cells, store, executor, log=lambda *_: None)["skipped"] == 1


# ------------------------------------------------------------------------------------------- shards + merge
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_shards_partition_the_cells(tmp_path, n):
    raw = base_config(tmp_path, seeds=[0, 1, 2])
    cells = build_plan(cfg.validate_config(raw))
    parts = [select_shard(cells, i, n) for i in range(1, n + 1)]
    hashes = [{c.hash for c in part} for part in parts]
    assert set().union(*hashes) == {c.hash for c in cells}
    for i in range(n):
        for j in range(i + 1, n):
            assert not hashes[i] & hashes[j]
    # deterministic whatever the order
    assert [c.hash for c in select_shard(list(reversed(cells)), 1, n)] == [c.hash for c in reversed(parts[0])]


def test_parse_shard_errors():
    assert parse_shard("2/3") == (2, 3)
    for bad in ("0/3", "4/3", "x", "1/0"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)


def test_sharded_runs_merge_into_one_report(tmp_path):
    from cru_harness.runner.cli import merge_dirs

    raw = base_config(tmp_path)
    config = cfg.validate_config(raw)
    cells = build_plan(config)
    dirs = []
    for i in (1, 2):
        store = CellStore(tmp_path / f"shard{i}")
        run_cells(select_shard(cells, i, 2), store, fake_executor([]), log=lambda *_: None)
        dirs.append(store.root)
    counts = merge_dirs(dirs, tmp_path / "merged")
    assert counts["copied"] == len(cells)
    assert {r["hash"] for r in load_results(tmp_path / "merged")} == {c.hash for c in cells}
    # the shards' plans travel too: the merged report names a planned cell no shard finished
    from cru_harness.reporting.cli import unfinished_plan_lines

    for i, directory in enumerate(dirs, start=1):
        planned = [{"hash": c.hash, "cell": c.describe()} for c in select_shard(cells, i, 2)]
        planned += [{"hash": "never-run", "cell": "m | tofu forget01 | GA seed=9"}] if i == 2 else []
        (directory / f"plan.shard{i}of2.json").write_text(json.dumps({"cells": planned}))
    merge_dirs(dirs, tmp_path / "merged2")
    assert sorted(p.name for p in (tmp_path / "merged2").glob("plan*.json")) == ["plan.shard1of2.json",
                                                                                 "plan.shard2of2.json"]
    lines = unfinished_plan_lines([tmp_path / "merged2"], load_results(tmp_path / "merged2"))
    assert len(lines) == 1 and f"1 of {len(cells) + 1} planned" in lines[0] and "GA seed=9" in lines[0]


def test_merge_with_a_mistyped_input_creates_nothing(tmp_path, capsys):
    from cru_harness.cli import main

    (tmp_path / "shard1" / "cells").mkdir(parents=True)
    assert main(["merge", str(tmp_path / "shard1"), str(tmp_path / "shrad2"), "--out", str(tmp_path / "m")]) == 2
    assert f"{tmp_path / 'shrad2'} holds no cells/ directory" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


# ------------------------------------------------------------------------------------------- PURGE
class RepositoryNotFoundError(Exception):
    """Named like huggingface_hub's: the resolver classifies errors by class name."""


def test_purge_candidates_for_a_comma_name():
    candidates = purge_candidates(10, "10_Prince_Harry,_Duke_of_Sussex")
    assert candidates[0] == "strzara/Phi-3-mini-4k-instruct-10_Prince_Harry,_Duke_of_Sussex_PURGE"
    assert "strzara/Phi-3-mini-4k-instruct-10_Prince_Harry_Duke_of_Sussex_PURGE" in candidates
    assert "strzara/Phi-3-mini-4k-instruct-10_Prince_Harry_PURGE" in candidates
    assert purge_candidates(1, "1_Stephen_King") == ["strzara/Phi-3-mini-4k-instruct-1_Stephen_King_PURGE"]
    with pytest.raises(ValueError):
        purge_candidates(3, "1_Stephen_King")


def test_purge_resolution_tries_candidates_then_lists(tmp_path, monkeypatch):
    # The Hub calls here are test doubles; an offline machine's HF_HUB_OFFLINE=1 (the GPU session's env.sh sets
    # it) would make the resolver skip the repository listing and fail this test for no fault of the code.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    tried = []

    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "config.json").write_text("{}")

    def fake_download(repo_id, cache_dir=None):  # test double for huggingface_hub.snapshot_download
        tried.append(repo_id)
        if repo_id.endswith("10_Prince_Harry_PURGE"):
            return str(tmp_path / "snap")
        raise RepositoryNotFoundError(repo_id)

    found = resolve_purge_checkpoint(10, snapshot_download=fake_download)
    assert found.status == "ok" and found.repo_id.endswith("10_Prince_Harry_PURGE")
    assert found.tried[0].endswith("Prince_Harry,_Duke_of_Sussex_PURGE")

    renamed = "strzara/Phi-3-mini-4k-instruct-7_Marie_Osmond_v2_PURGE"
    # a repository uploaded as the trainer's checkpoint folder: the model is the one folder holding config.json
    (tmp_path / "snap2" / "checkpoint-1000").mkdir(parents=True)
    (tmp_path / "snap2" / "checkpoint-1000" / "config.json").write_text("{}")
    def download2(repo_id, cache_dir=None):
        if repo_id == renamed:
            return str(tmp_path / "snap2")
        raise RepositoryNotFoundError(repo_id)
    found = resolve_purge_checkpoint(7, snapshot_download=download2, list_repos=lambda: [renamed, "x/y"])
    assert found.status == "ok" and found.repo_id == renamed
    assert found.path == str(tmp_path / "snap2" / "checkpoint-1000")
    # a repository without a model: unavailable, saying so (not a crash when the cell loads it)
    # two such folders: which one is meant cannot be told
    (tmp_path / "snap2" / "checkpoint-500").mkdir()
    (tmp_path / "snap2" / "checkpoint-500" / "config.json").write_text("{}")
    two = resolve_purge_checkpoint(7, snapshot_download=download2, list_repos=lambda: [renamed])
    assert two.status == "unavailable" and "exactly one folder below it" in two.reason
    # a repository without a model: unavailable, saying so (not a crash when the cell loads it)
    for folder in ("checkpoint-500", "checkpoint-1000"):
        (tmp_path / "snap2" / folder / "config.json").unlink()
    empty = resolve_purge_checkpoint(7, snapshot_download=download2, list_repos=lambda: [renamed])
    assert empty.status == "unavailable" and "holds no one model (no config.json at its root" in empty.reason
    # a local copy follows the same rule
    (tmp_path / "snap2" / "checkpoint-1000" / "config.json").write_text("{}")
    local = resolve_purge_checkpoint(7, local_path=tmp_path / "snap2")
    assert local.status == "ok" and local.path == str(tmp_path / "snap2" / "checkpoint-1000")

    missing = resolve_purge_checkpoint(7, snapshot_download=download2, list_repos=lambda: [])
    assert missing.status == "unavailable" and "no PURGE checkpoint published for target 7" in missing.reason


def test_purge_local_stand_in(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    assert resolve_purge_checkpoint(3, local_path=tmp_path / "ckpt").status == "ok"
    bad = resolve_purge_checkpoint(3, local_path=tmp_path / "nothing")
    assert bad.status == "unavailable" and "not a model directory" in bad.reason


OFFLINE_SCRIPT = r"""
import json, sys
from pathlib import Path
from cru_harness.benchmarks.rwku.purge import resolve_purge_checkpoint
from cru_harness.runner import config as cfg
from cru_harness.runner.plan import build_plan
from cru_harness.runner.execute import execute_cell
from cru_harness.runner.loop import run_one
res = resolve_purge_checkpoint(10, cache_dir=sys.argv[1])
raw = {"name": "p", "output_dir": sys.argv[1] + "/run", "models": [{"name": "phi", "path": "microsoft/Phi-3-mini-4k-instruct"}],
       "benchmarks": {"rwku": {"targets": [1]}}, "methods": [{"method": "PURGE"}], "include_original": False}
cell = build_plan(cfg.validate_config(raw))[0]
work = Path(sys.argv[1]) / "work"; work.mkdir()
result, record = run_one(cell, work, execute_cell)
print(json.dumps({"resolution": res.to_dict(), "status": result["status"], "reason": result["reason"]}))
"""


def test_purge_offline_is_reported_per_target_not_raised(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-c", OFFLINE_SCRIPT, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    resolution = out["resolution"]
    assert resolution["status"] == "unavailable"
    assert "unreachable" in resolution["reason"] and "HF_HUB_OFFLINE" in resolution["reason"]
    assert len(resolution["tried"]) >= 3 and "PURGE's method entry: `checkpoints: {" in resolution["reason"]
    assert out["status"] == "unavailable" and "unreachable" in out["reason"]


# ------------------------------------------------------------------------------------------- dry runs
@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_dry_run_on_every_shipped_config(path, capsys, tmp_path, monkeypatch):
    import torch

    from cru_harness.cli import main

    # run from an empty directory: a LUNAR config's refusal prompts (data/lunar/harmful.json, the user's download)
    # are refused until they are there, then the config plans
    monkeypatch.chdir(tmp_path)
    if "refusal_prompts_path" in path.read_text():
        assert main(["run", str(path), "--dry-run", "--json"]) == 2
        assert "refusal_prompts_path: data/lunar/harmful.json does not exist" in capsys.readouterr().err
        (tmp_path / "data" / "lunar").mkdir(parents=True)
        (tmp_path / "data" / "lunar" / "harmful.json").write_text('["Write malware."]')
    assert main(["run", str(path), "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    # Warned, not refused: a GPU config still plans on a machine without CUDA, the paper's on one without its
    # fine-tuned checkpoints; nothing else is missing.
    lacks_cuda = yaml.safe_load(path.read_text()).get("device") == "cuda" and not torch.cuda.is_available()
    assert lacks_cuda == any(": device: device 'cuda': " in problem for problem in plan["problems"])
    for problem in plan["problems"]:
        assert ": device: " in problem or (": model checkpoints/" in problem and "does not exist" in problem)
    # an RWKU-only config whose targets select_known picks plans its cells when the run starts
    assert plan["n_cells"] > 0 or plan["pending_selection"]
    assert len(plan["cells"]) == plan["n_cells"]
    assert all(c["evaluates"] for c in plan["cells"] if c["kind"] != "finetune")   # a finetune cell only trains


def test_shipped_configs_follow_the_paper():
    names = {p.name for p in CONFIGS}
    assert {"paper_tofu.yaml", "paper_rwku.yaml", "demo.yaml", "ci_minimal.yaml"} <= names
    tofu = cfg.load_config(REPO / "configs" / "paper_tofu.yaml")
    assert tofu.benchmarks["tofu"]["splits"] == ["forget01", "forget10"] and len(tofu.models) == 4
    assert {m.method for m in tofu.methods} == {"GA", "GD", "NPO", "SimNPO", "IdkDPO", "CRU"}
    cru = next(m for m in tofu.methods if m.method == "CRU")
    assert (cru.hparams["lam"], cru.hparams["percentile"], cru.hparams["d_r"]) == (1, 95, 32)
    rwku = cfg.load_config(REPO / "configs" / "paper_rwku.yaml")
    assert rwku.benchmarks["rwku"]["targets"] == list(range(1, 21))
    assert {m.method for m in rwku.methods} == {"GA", "GD", "NPO", "SimNPO", "DPO", "RT", "ICU", "PURGE", "CRU"}
    cru = next(m for m in rwku.methods if m.method == "CRU")
    assert (cru.hparams["lam"], cru.hparams["percentile"], cru.hparams["d_r"]) == (50, 90, 256)
    cells = build_plan(rwku)
    assert sum(c.method == "PURGE" for c in cells) == 20 and all(c.seed is None for c in cells if c.method == "ICU")


def test_dry_run_cli_error_names_key(tmp_path, capsys):
    from cru_harness.cli import main

    raw = base_config(tmp_path)
    raw["methods"][0]["lrr"] = 1
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--dry-run"]) == 2
    assert "methods[0].lrr" in capsys.readouterr().err


def test_low_precision_scoring_keeps_log_softmax_in_float32():
    from cru_harness.runner.config import ModelSpec
    from cru_harness.runner.evaluation import eval_model_args

    bf16 = eval_model_args(ModelSpec("m", "p", dtype="float32", eval_dtype="bfloat16"), "/m", routers="/r")
    assert bf16 == {"pretrained": "/m", "dtype": "bfloat16", "softmax_dtype": "float32", "routers": "/r"}
    fp32 = eval_model_args(ModelSpec("m", "p", dtype="float32"), "/m")
    assert fp32 == {"pretrained": "/m", "dtype": "float32"}  # already exact: nothing added


def test_rwku_cell_beyond_target_10_keeps_its_probes_and_records_utility_unavailable(tmp_path, rwku_dir):
    """RWKU ships utility sets for targets 1-10 only: such a cell drops (and names) its utility tasks."""
    from cru_harness.runner.evaluation import tasks_with_data
    from cru_harness.reporting.tables import aggregate, to_markdown

    raw = base_config(tmp_path, benchmarks={"rwku": {"targets": [2, 17], "tasks": [
        "rwku_forget", "rwku_utility_mmlu", "rwku_icu_utility"]}}, models=[{"name": "m", "path": "smollm2"}],
        methods=[{"method": "GA"}])
    cells = {c.target: c for c in build_plan(cfg.validate_config(raw)) if c.kind == "original"}
    kept, dropped = tasks_with_data(cells[2], str(rwku_dir))
    assert kept == ["rwku_forget", "rwku_utility_mmlu", "rwku_icu_utility"] and dropped == {}
    kept, dropped = tasks_with_data(cells[17], str(rwku_dir))
    assert kept == ["rwku_forget"]
    assert set(dropped) == {"rwku_utility_mmlu", "rwku_icu_utility"}
    assert "retain_mmlu" in dropped["rwku_utility_mmlu"] and "targets 1-10" in dropped["rwku_utility_mmlu"]
    assert "fluency" in dropped["rwku_icu_utility"]

    # the report says which means cover fewer targets
    results = [{"benchmark": "rwku", "kind": "method", "model": "m", "label": "GA", "method": "GA", "status": "ok",
                "target": t, "metrics": {"forget_fb": 0.1, "utility_mmlu": 0.3} if t == 2 else {"forget_fb": 0.2},
                "details": {"tasks_unavailable": dropped} if t == 17 else {}} for t in (2, 17)]
    table = to_markdown(aggregate(results, "rwku"), "rwku")
    assert "rwku_utility_mmlu: no data for target(s) 17, mean over 1 cell(s)" in table
    assert "mean over 1 of 2 cells" not in table   # the same gap, not noted twice


def test_local_builds_lists_each_testbed_model_once(tmp_path):
    from cru_harness.runner.models import local_builds

    raw = base_config(tmp_path, models=[
        {"name": "a", "path": "zoo:llama", "retain": {"checkpoint": "zoo:llama:retain"}},
        {"name": "b", "path": "zoo:llama", "retain": {"checkpoint": "zoo:llama:retain"}},
        {"name": "c", "path": "smollm2", "benchmarks": ["tofu"]},
        {"name": "d", "path": str(tmp_path / "local_model")}])
    assert local_builds(cfg.validate_config(raw)) == ["zoo:llama", "zoo:llama:retain", "smollm2"]


def test_purge_download_failing_for_a_local_reason_fails_the_cell_not_unavailable(monkeypatch):
    """A missing repository or an unreachable Hub makes PURGE 'unavailable' (external); a local failure (a full
    disk, permissions, a bug) propagates, so the cell is recorded as failed and the run exits non-zero."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def disk_full(repo_id, cache_dir=None):
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        resolve_purge_checkpoint(10, snapshot_download=disk_full, list_repos=lambda: [])

    class HfHubHTTPError(Exception):   # huggingface_hub's HTTP error, matched by name as the resolver does
        pass

    def server_error(repo_id, cache_dir=None):
        raise HfHubHTTPError("500 Server Error")

    down = resolve_purge_checkpoint(10, snapshot_download=server_error, list_repos=lambda: [])
    assert down.status == "unavailable" and "unreachable" in down.reason and "500 Server Error" in down.reason


def test_reuse_copies_the_finished_cells_the_plan_shares_and_computes_the_rest(tmp_path):
    """A study starting from the real-regime run: `--reuse DIR` copies DIR's finished cells that this plan holds
    (same hash), never a failed one and never one this plan lacks; the rest are computed here."""
    from cru_harness.runner.cli import run_config

    first = cfg.validate_config(base_config(tmp_path, output_dir=str(tmp_path / "real"), seeds=[0]))
    shared = build_plan(first)

    def executor(cell, workdir):   # test double: the first run's GA cell on forget10 fails
        if cell.label == "GA" and cell.split == "forget10":
            raise RuntimeError("boom")
        return fake_executor([])(cell, workdir)

    run_cells(shared, CellStore(first.output_dir), executor, log=lambda *_: None)
    study = cfg.validate_config(base_config(tmp_path, output_dir=str(tmp_path / "study"), seeds=[0], methods=[
        {"method": "GA", "lr": 1e-4}, {"method": "CRU", "lambda": 1, "percentile": 95},
        {"method": "CRU", "label": "CRU-p90", "lambda": 1, "percentile": 90}]))
    calls, logged = [], []
    assert run_config(study, executor=fake_executor(calls), reuse=first.output_dir, report=False,
                      log=logged.append) == 0
    failed = next(c.hash for c in shared if c.label == "GA" and c.split == "forget10")
    new = [c.hash for c in build_plan(study) if c.label == "CRU-p90"]
    assert sorted(calls) == sorted(new + [failed])
    assert f"--reuse {first.output_dir}: copied {len(shared) - 1} finished cell(s) of this plan" in logged
    copied = CellStore(study.output_dir).cell_dir(shared[0].hash)
    assert (copied / "result.json").read_bytes() == (CellStore(first.output_dir).cell_dir(shared[0].hash)
                                                     / "result.json").read_bytes()
    with pytest.raises(InputError, match="own output directory"):
        run_config(study, executor=fake_executor([]), reuse=study.output_dir)
    with pytest.raises(MissingInputError, match="not a cru-harness run"):
        run_config(study, executor=fake_executor([]), reuse=tmp_path / "nowhere")


def test_reuse_copies_a_cell_that_differs_only_in_label_under_the_plans_hash_and_label(tmp_path):
    """A study's row at the run's own CRU setting (`CRU-paper` beside the run's `CRU`) computes what the run's
    cell computed (a label enters no computation): `--reuse` copies that cell under the study's hash and label,
    its record naming where it came from; a row whose settings differ is computed, and the copy is the study's
    own from then on (a second run computes nothing)."""
    from cru_harness.runner.cli import run_config
    from cru_harness.runner.plan import computation_key

    first = cfg.validate_config(base_config(tmp_path, output_dir=str(tmp_path / "real"), seeds=[0]))

    def executor(cell, workdir):   # test double: numbers of the cell's own
        return {"metrics": {"forget_rouge_l": int(cell.hash, 16) % 1000 / 1000}}

    run_cells(build_plan(first), CellStore(first.output_dir), executor, log=lambda *_: None)
    study = cfg.validate_config(base_config(tmp_path, output_dir=str(tmp_path / "study"), seeds=[0], methods=[
        {"method": "CRU", "label": "CRU-paper", "lambda": 1, "percentile": 95},
        {"method": "CRU", "label": "CRU-p90", "lambda": 1, "percentile": 90}]))
    run_cru = {c.split: c for c in build_plan(first) if c.method == "CRU"}
    paper = [c for c in build_plan(study) if c.label == "CRU-paper"]
    assert len(paper) == 2 and all(c.hash != run_cru[c.split].hash for c in paper)
    assert all(c.computation == run_cru[c.split].computation for c in paper)
    calls, logged = [], []
    assert run_config(study, executor=fake_executor(calls), reuse=first.output_dir, report=False,
                      log=logged.append) == 0
    assert sorted(calls) == sorted(c.hash for c in build_plan(study) if c.label == "CRU-p90")
    assert any(line.endswith("and 2 that differ only in label (CRU-paper <- CRU)") for line in logged), logged
    source, store = CellStore(first.output_dir), CellStore(study.output_dir)
    for cell in paper:
        origin = run_cru[cell.split]
        result, record = store.load_result(cell.hash), store.load_record(cell.hash)
        assert (result["hash"], result["label"], record["hash"]) == (cell.hash, "CRU-paper", cell.hash)
        assert result["metrics"] == source.load_result(origin.hash)["metrics"]
        assert record["resolved_config"]["label"] == "CRU-paper"
        assert computation_key(record["resolved_config"]) == origin.computation
        assert record["reused_from"] == {"hash": origin.hash, "label": "CRU", "run": str(first.output_dir)}
    again = []
    assert run_config(study, executor=fake_executor(again), reuse=first.output_dir, report=False,
                      log=lambda *_: None) == 0
    assert again == []


def test_reuse_for_a_reader_of_router_bundles_copies_another_labels_cru_cell_only_with_its_bundle(tmp_path):
    """A gate_gap study reads its CRU cells' bundles, which a run's tarball leaves out: with `bundles`, a CRU cell
    of another label is copied only where its bundle is on disk, and the bundle comes with it; the others are
    left to compute. Cells copied by hash and other methods' cells are copied as before."""
    from cru_harness.runner.cli import reuse_cells

    first = cfg.validate_config(base_config(tmp_path, output_dir=str(tmp_path / "real"), seeds=[0]))
    source = CellStore(first.output_dir)
    run_cells(build_plan(first), source, fake_executor([]), log=lambda *_: None)
    run_cru = {c.split: c for c in build_plan(first) if c.method == "CRU"}
    bundle = source.cell_dir(run_cru["forget01"].hash) / "work" / "routers"
    bundle.mkdir(parents=True)
    (bundle / "cru_bundle.json").write_text("{}")
    study = cfg.validate_config(base_config(tmp_path, output_dir=str(tmp_path / "study"), seeds=[0], methods=[
        {"method": "GA", "lr": 1e-4}, {"method": "CRU", "label": "CRU-paper", "lambda": 1, "percentile": 95}]))
    cells = build_plan(study)
    store = CellStore(study.output_dir)
    shared = sum(c.label != "CRU-paper" for c in cells)
    assert reuse_cells(first.output_dir, store, cells, log=lambda *_: None, bundles=True) == shared + 1
    paper = {c.split: c for c in cells if c.label == "CRU-paper"}
    copied = store.cell_dir(paper["forget01"].hash)
    assert store.load_result(paper["forget01"].hash)["label"] == "CRU-paper"
    assert (copied / "work" / "routers" / "cru_bundle.json").read_text() == "{}"
    assert store.load_result(paper["forget10"].hash) is None
    assert reuse_cells(first.output_dir, CellStore(tmp_path / "other"), cells, log=lambda *_: None) == len(cells)


def test_reuse_with_only_copies_the_shared_cells_the_labels_cells_start_from(tmp_path):
    """`--reuse DIR --only LABEL`: the label's cells start from the plan's model (its fine-tune cell, where the
    config fine-tunes) and read its oracle for Forget Quality, so every finished shared cell is copied, while only
    the label's cells run."""
    from cru_harness.runner.cli import run_config

    first = cfg.validate_config(base_config(tmp_path, output_dir=str(tmp_path / "real"), seeds=[0]))
    shared = build_plan(first)
    run_cells(shared, CellStore(first.output_dir), fake_executor([]), log=lambda *_: None)
    study = cfg.validate_config(base_config(tmp_path, output_dir=str(tmp_path / "study"), seeds=[0], methods=[
        {"method": "GA", "lr": 1e-4}, {"method": "CRU", "label": "CRU-p90", "lambda": 1, "percentile": 90}]))
    in_study = {c.hash for c in build_plan(study)}
    reused = [c for c in shared if c.hash in in_study]
    assert {c.kind for c in reused} == {"retain", "original", "method"}   # the oracle, the base, GA
    calls, logged = [], []
    assert run_config(study, executor=fake_executor(calls), reuse=first.output_dir, report=False,
                      log=logged.append, only="CRU-p90") == 0
    assert sorted(calls) == sorted(c.hash for c in build_plan(study) if c.label == "CRU-p90")
    assert f"--reuse {first.output_dir}: copied {len(reused)} finished cell(s) of this plan" in logged
    assert all(CellStore(study.output_dir).load_result(c.hash)["status"] == "ok" for c in reused)


def test_reuse_keeps_a_target_choice_the_run_has_already_made(tmp_path):
    """The RWKU cells of a run were planned from its saved target choice: `--reuse` copies the other run's choice
    only where the run has none (a merge of shards, which share one choice, still takes the copy)."""
    from cru_harness.runner.cli import copy_target_choices
    from cru_harness.runner.targets import SELECTION_DIR

    source, own = CellStore(tmp_path / "real"), CellStore(tmp_path / "study")
    for store, text in ((source, '{"chosen": [1]}'), (own, '{"chosen": [2]}')):
        (store.root / SELECTION_DIR).mkdir(parents=True)
        (store.root / SELECTION_DIR / "M.json").write_text(text)
    (source.root / SELECTION_DIR / "N.json").write_text('{"chosen": [3]}')
    copy_target_choices(source, own, overwrite=False)
    assert (own.root / SELECTION_DIR / "M.json").read_text() == '{"chosen": [2]}'
    assert (own.root / SELECTION_DIR / "N.json").read_text() == '{"chosen": [3]}'
    copy_target_choices(source, own)
    assert (own.root / SELECTION_DIR / "M.json").read_text() == '{"chosen": [1]}'


def test_a_retain_oracle_trains_with_every_key_its_train_block_gives(tmp_path, monkeypatch):
    """`retain: {train: ...}`: each key validation accepts (weight_decay too) reaches the training loop."""
    import cru_harness.testbed.finetune as testbed_finetune
    from cru_harness.runner.models import resolve_data_dir
    from cru_harness.runner.training import train_retain_model

    class Stop(Exception):
        pass

    seen = {}

    def capture(model, tokenizer, texts, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(testbed_finetune, "finetune_causal_lm", capture)
    given = {"epochs": 2, "lr": 1e-3, "batch_size": 4, "max_length": 64, "weight_decay": 0.5}
    raw = base_config(tmp_path, seeds=[0], methods=[{"method": "GA"}], data_dir="testbed:world")
    raw["models"][0]["retain"] = {"train": given}
    cell = next(c for c in build_plan(cfg.validate_config(raw)) if c.kind == "retain")
    with pytest.raises(Stop):
        train_retain_model(cell, cell.extra["retain"]["value"], tmp_path, resolve_data_dir(cell.data_dir),
                           {"resources": {}})
    assert {k: seen[k] for k in given} == given and seen["seed"] == 0


def test_the_starting_models_do_not_depend_on_which_seeds_run(tmp_path):
    """The fine-tune and a trained retain oracle are one model for every seed (the cells that start from them do
    not hash their seed): a run of seeds 1, 2 plans the very cells a run of 0, 1, 2 made, so it can reuse them."""
    def cells(seeds):
        raw = base_config(tmp_path, seeds=seeds, methods=[{"method": "GA"}], data_dir="testbed:world")
        raw["models"][0].update(finetune={"data": "full", "num_epochs": 1},
                                retain={"train": {"epochs": 1}})
        return {(c.kind, c.split, c.method, c.seed): c.hash for c in build_plan(cfg.validate_config(raw))}

    all_seeds, later = cells([0, 1, 2]), cells([1, 2])
    starting = [key for key in later if key[0] in ("finetune", "retain")]
    assert starting and all(key[3] == 0 for key in starting)
    assert {key: later[key] for key in later} == {key: all_seeds[key] for key in later}


def test_trust_remote_code_reaches_every_model_load_of_a_cell(tmp_path, monkeypatch):
    """A model's `trust_remote_code` loads it for the baselines, the fine-tune and the failure classes' NLL as it
    loads it for lm-eval and CRU (a model with its own code and a native class would otherwise train with one
    implementation and be evaluated with another)."""
    import cru_harness.training.engine as trainer
    import cru_harness.devices as devices
    from cru_harness.scoring.failure_modes import AnswerNLLScorer
    from cru_harness.runner import training

    class Stop(Exception):
        pass

    seen = []

    def loader(path, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        raise Stop

    for module in (trainer, devices):
        monkeypatch.setattr(module, "load_causal_lm", loader)
    raw = base_config(tmp_path, seeds=[0], methods=[{"method": "GA"}], data_dir="testbed:world")
    raw["models"][0].update(trust_remote_code=True, finetune={"data": "full"})
    cells = build_plan(cfg.validate_config(raw))
    ga = next(c for c in cells if c.method == "GA")
    tune = next(c for c in cells if c.kind == "finetune")
    outcome = {"resources": {}, "details": {}, "artifacts": {}}
    from cru_harness.runner.execute import method_context
    from cru_harness.runner.models import resolve_data_dir, resolve_model_path

    data_dir, model = resolve_data_dir(ga.data_dir), resolve_model_path("zoo:llama")
    with pytest.raises(Stop):
        ga.method_plugin.run(method_context(ga, model, tmp_path, data_dir, outcome))
    with pytest.raises(Stop):
        training.train_finetuned_model(tune, tune.hparams, model, "full", tmp_path / "ft", data_dir, outcome)
    with pytest.raises(Stop):
        AnswerNLLScorer(model, trust_remote_code=True)
    assert seen == [True, True, True]


def test_a_forced_chat_choice_reaches_the_fine_tune_of_an_rwku_only_model(tmp_path):
    """`evaluation.apply_chat_template` decides how a fine-tune writes its rows for any benchmark (the TOFU presets
    only for TOFU): it is in the finetune cell, hence in its hash."""
    def finetune_cell(**evaluation):
        raw = {"name": "t", "output_dir": str(tmp_path / "run"), "seeds": [0],
               "models": [{"name": "m", "path": "zoo:llama", "benchmarks": ["rwku"],
                           "finetune": {"data": "rwku:1:passage"}}],
               "benchmarks": {"rwku": {"targets": [1]}}, "methods": [{"method": "GA"}], "evaluation": evaluation}
        return next(c for c in build_plan(cfg.validate_config(raw)) if c.kind == "finetune")

    forced = finetune_cell(apply_chat_template=False, tofu_preset="legacy", tofu_model_family="phi")
    assert forced.evaluation == {"apply_chat_template": False}
    assert forced.hash != finetune_cell().hash
