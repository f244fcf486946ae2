"""A benchmark's settings of the methods reach them through its hooks (`api.Benchmark.method_defaults`,
`method_settings`, `lora_preset`, `refusals`, `score_tasks`, `prompt_metadata`): a benchmark registered here, not
a built-in, sets each one, and the methods' code names no benchmark."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from cru_harness import api, plugins
from cru_harness.baselines import make_config
from cru_harness.errors import InputError


class Drill(api.Benchmark):
    """A benchmark of its own: GA at its own rate and schedule, a LoRA preset, refusals, one scoring task."""

    name = "drill"
    unit = "split"
    order = 0          # first in the registry while registered (published_refusals asks in order)

    def method_defaults(self, method, split, given=()):
        if method != "GA":
            return {}
        if split == "hard" and "learning_rate" not in given:
            raise InputError("drill: GA on the hard split needs its own learning_rate")
        return {"learning_rate": 3e-4, "warmup_steps": 7, "num_epochs": 2}

    def method_settings(self, method, split):
        return {"lam": 9} if method == "CRU" else {}

    def lora_preset(self):
        return {"r": 4, "alpha": 8.0, "target_modules": ("q_proj",)}

    def refusals(self, data_dir):
        return ["Drill says no."]

    def score_tasks(self, forget):
        return (f"drill_{forget or 'all'}",)

    def prompt_metadata(self, prompt_format):
        return {"drill_format": prompt_format}


@pytest.fixture
def drill():
    bench = plugins.benchmarks.register(Drill())
    try:
        yield bench
    finally:
        plugins.benchmarks.unregister("drill")


def test_a_benchmarks_method_defaults_sit_below_the_cells_values(drill):
    config = make_config("ga", "drill")
    assert (config.learning_rate, config.warmup_steps, config.num_epochs) == (3e-4, 7, 2)
    assert make_config("ga", "drill", learning_rate=1e-6).learning_rate == 1e-6
    # a warm-up given in epochs replaces the benchmark's in steps
    assert make_config("ga", "drill", warmup_epochs=0.5).warmup_steps is None
    assert make_config("npo", "drill").learning_rate == make_config("npo").learning_rate   # not GA: the dataclass's
    with pytest.raises(InputError, match="needs its own learning_rate"):
        make_config("ga", "drill", "hard")
    assert make_config("ga", "drill", "hard", learning_rate=2e-5).learning_rate == 2e-5
    # the runner's trainer config of a cell asks the same hook, by the method's runner name
    cell = SimpleNamespace(benchmark="drill", split="easy", hparams={"num_epochs": 4})
    config = plugins.methods.get("GA").cell_config(cell)
    assert (config.learning_rate, config.num_epochs) == (3e-4, 4)
    assert api.Benchmark().method_defaults("GA", None) == {}


def test_the_built_ins_keep_their_published_settings():
    """RWKU's LLaMA-Factory schedule under each method's own rate; WMDP's rule; TOFU's SimNPO per split; the
    CRU paper's RWKU setting (and WMDP's, which takes it) in the cells' hyperparameters."""
    npo = make_config("npo", "rwku")
    assert (npo.learning_rate, npo.beta, npo.effective_batch_size, npo.alpha, npo.num_epochs, npo.lr_scheduler,
            npo.warmup_steps, npo.weight_decay, npo.max_length) == (2e-6, 0.2, 16, 0.0, 3, "cosine", 20, 0.0, 512)
    assert make_config("npo_kl", "rwku").alpha == 1.0 and make_config("dpo", "rwku").loss_scale == 1.0
    assert make_config("rmu", "rwku").warmup_steps is None and make_config("whp", "rwku").num_epochs == 10
    ga = make_config("ga", "wmdp", "bio")
    assert (ga.num_epochs, ga.effective_batch_size, ga.lr_scheduler, ga.learning_rate) == (1, 4, "constant", 1e-5)
    assert make_config("simnpo", "tofu", "forget05").beta == 2.5
    assert make_config("simnpo", "tofu_author", "author_1").beta == 4.5   # one author: no split setting
    with pytest.raises(InputError, match="forget05 and forget10 only"):
        make_config("simnpo", "tofu", "forget01")
    cru = {"lam": 50, "percentile": 90, "d_r": 256}
    assert plugins.benchmarks.get("rwku").method_settings("CRU", 1) == cru
    assert plugins.benchmarks.get("wmdp").method_settings("CRU", "bio") == cru
    assert plugins.benchmarks.get("tofu").method_settings("CRU", "forget10") == {}
    assert plugins.benchmarks.get("wmdp").method_settings("RMU", "bio")["steering_coeff"] == 6.5


def test_a_benchmarks_lora_preset_and_refusals(drill):
    from cru_harness.baselines.api import published_refusals
    from cru_harness.training.lora import LoraSettings, lora_presets

    assert set(lora_presets()) == {"drill", "rwku"}
    assert LoraSettings.from_dict({"preset": "drill", "r": 2}) == LoraSettings(r=2, alpha=8.0,
                                                                                target_modules=("q_proj",))
    assert published_refusals(None) == ["Drill says no."]   # the first registered benchmark that has some


def test_the_attack_command_scores_with_the_benchmarks_tasks(drill, tmp_path):
    from cru_harness.attacks.cli import score_command

    line = score_command("m", None, "phi", None, tmp_path, benchmark=drill, forget="f1")
    assert "--tasks drill_f1 " in line and json.dumps({"drill_format": "phi"}) in line
    rwku = score_command("m", "r", "chat", "/d", tmp_path, benchmark=plugins.benchmarks.get("rwku"))
    assert "--tasks rwku_forget,rwku_neighbor,rwku_mia --apply_chat_template" in rwku
    tofu = score_command("m", None, "phi", None, tmp_path, benchmark=plugins.benchmarks.get("tofu"), forget="forget05")
    assert "--tasks tofu_forget05_suite" in tofu and '"tofu_model_family": "phi"' in tofu
    assert "evaluate it in a runner config" in score_command("m", None, "plain", None, tmp_path,
                                                             benchmark=api.Benchmark())


def test_unlearn_names_a_registered_benchmark(tmp_path, capsys):
    from cru_harness.cli import main

    argv = ["unlearn", "--base", str(tmp_path), "--forget", "f.json", "--retain", "r.json", "--out",
            str(tmp_path / "out"), "--benchmark", "nosuch"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nosuch" in err[0] and "tofu" in err[0]


def test_icu_runs_where_a_benchmark_has_its_task_variants(drill):
    """ICU asks the benchmark for its `icu` variants (RWKU's `rwku_icu_*`): elsewhere it is refused."""
    icu, rwku = plugins.methods.get("ICU"), plugins.benchmarks.get("rwku")
    assert icu.unsupported("rwku") is None and "cannot run on tofu" in icu.unsupported("tofu")
    assert "cannot run on drill" in icu.unsupported("drill")
    assert icu.tasks_for(rwku, rwku.default_tasks) == ("rwku_icu_forget", "rwku_icu_neighbor", "rwku_icu_mia",
                                                       "rwku_icu_utility")
    assert icu.tasks_for(rwku, ("rwku_icu_fb", "mmlu")) == ("rwku_icu_fb", "mmlu")
    assert rwku.task_variants(("rwku_forget",), "paraphrase") == ()   # no prompt attack variant


def test_a_prompt_attack_on_a_benchmark_without_its_variants_is_one_line(tmp_path, capsys):
    from cru_harness.cli import main
    from cru_harness.testbed.zoo import tiny_checkpoint

    out = tmp_path / "out"
    argv = ["attack", "--attack", "in_context", "--model", str(tiny_checkpoint("llama")), "--out", str(out),
            "--benchmark", "rwku"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rwku's tasks have no variant" in err[0] and not out.exists()
