"""The registries: built-ins found through their entry points, clear errors for unknown names, and a plugin
distribution defined outside this package (a benchmark, a method, an attack) built, installed and run through
`cru-harness run` end to end on a tiny model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cru_harness import api, plugins
from cru_harness.plugins import PluginError, UnknownPluginError
from cru_harness.runner import config as cfg

REPO = Path(__file__).resolve().parents[1]


def declared_entry_points(group: str) -> dict[str, str]:
    """name -> object path of the entry points this project's pyproject.toml declares in `group`."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return dict(project["entry-points"][group])


def test_builtins_register_through_their_entry_points():
    """The built-ins are what pyproject.toml's entry points name (no list of them here: a benchmark package added to
    pyproject is checked as it lands), listed by their `order` (the paper's tables), then by name."""
    from importlib.metadata import entry_points

    for kind, registry in (("benchmark", plugins.benchmarks), ("method", plugins.methods),
                           ("attack", plugins.attacks)):
        declared = declared_entry_points(plugins.GROUPS[kind])
        assert declared, kind
        installed = {ep.name: ep.value for ep in entry_points(group=plugins.GROUPS[kind])}
        assert {name: installed.get(name) for name in declared} == declared   # the installed copy is this one
        names = registry.names()
        assert {name.lower() for name in declared} <= {name.lower() for name in names}
        listed = list(registry)
        assert names == [p.name for p in sorted(listed, key=lambda p: (p.order, p.name.lower()))]
    # the paper's table order: TOFU before its one-author split before RWKU; GA first, CRU after the baselines
    order = plugins.benchmarks.names()
    assert order.index("tofu") < order.index("tofu_author") < order.index("rwku")
    methods = plugins.methods.names()
    assert methods[:3] == ["GA", "GD", "GD-KL"] and methods.index("WHP") < methods.index("CRU")
    assert "identity" in plugins.attacks.names()
    assert plugins.methods.canonical("simnpo") == "SimNPO" and plugins.methods.canonical("nope") is None


def test_methods_say_what_they_need_beyond_their_trainers_flags():
    """`cru-harness methods` lists `needs`: LUNAR fails without its refusal prompts, DPO's alternate answers on RWKU
    are the pair corpus, not refusals."""
    needs = {name: plugins.methods.get(name).needs for name in ("GA", "GD", "NPO", "IdkDPO", "DPO", "RT", "LUNAR")}
    assert needs["GA"] == () and needs["GD"] == ("retain corpus",)
    assert needs["IdkDPO"] == ("retain corpus", "reference model", "refusals")
    assert needs["DPO"][:2] == ("retain corpus", "reference model") and "RWKU's pair corpus" in needs["DPO"][2]
    assert "refusals" not in needs["DPO"] and len(needs["DPO"]) == 3
    assert needs["RT"] == ("retain corpus", "refusals (a forget row's own, as RWKU's reject corpus gives; else a "
                                            "benchmark's, TOFU's IdkDPO list)")
    assert needs["LUNAR"] == ("retain corpus", "refusal_prompts_path (LUNAR's harmful.json)")


def test_unknown_names_are_one_line_errors_naming_the_registered_ones():
    with pytest.raises(UnknownPluginError, match=r"unknown method 'NPOO' \(did you mean 'NPO'\?\); registered: GA"):
        plugins.methods.get("NPOO")
    raw = {"name": "t", "models": [{"name": "m", "path": "zoo:llama"}], "benchmarks": {"nonesuch": {}},
           "methods": ["GA"]}
    allowed = ", ".join(plugins.benchmarks.names())
    with pytest.raises(cfg.ConfigError, match=rf"benchmarks\.nonesuch: unknown key.*allowed here: {allowed}"):
        cfg.validate_config(raw)
    raw = {**raw, "benchmarks": {"tofu": {}}, "attacks": ["quantise"]}
    with pytest.raises(cfg.ConfigError, match=r"attacks\[0\]\.attack: unknown attack 'quantise'.*registered: identity"):
        cfg.validate_config(raw)


def test_open_unlearnings_method_names_are_other_names_of_ours(tmp_path):
    """open-unlearning's trainer names (src/trainer/__init__.py) name our methods wherever a method is named: the
    registry, a runner config (whose cells are those of the canonical name, hashes included), a finished run's
    methods (the report), the trainers' table (`baselines.make_config`)."""
    from cru_harness.baselines.registry import get_method
    from cru_harness.reporting.settings import configured_methods
    from cru_harness.runner.plan import build_plan

    ours = {"GradAscent": "GA", "GradDiff": "GD", "NPO": "NPO", "SimNPO": "SimNPO", "DPO": "DPO", "RMU": "RMU",
            "UNDIAL": "UNDIAL", "SatImp": "SatImp", "WGA": "WGA", "CEU": "CE-U", "Lunar": "LUNAR", "IdkDPO": "IdkDPO"}
    assert {name: plugins.methods.canonical(name) for name in ours} == ours
    assert plugins.methods.known_as() == {"GradAscent": "GA", "GradDiff": "GD", "CEU": "CE-U"}
    assert plugins.methods.get("graddiff") is plugins.methods.get("GD") and "CEU" in plugins.methods
    assert get_method("GradAscent") is get_method("ga") and get_method("CEU") is get_method("ceu")

    raw = {"name": "t", "output_dir": str(tmp_path), "models": [{"name": "m", "path": "zoo:llama"}], "seeds": [0],
           "benchmarks": {"tofu": {"splits": ["forget01"]}}}
    cells = {names: [(c.method, c.label, c.hash) for c in build_plan(cfg.validate_config(
        {**raw, "methods": [{"method": n, "lr": 1e-5} for n in names]})) if c.kind == "method"]
        for names in (("GradAscent", "GradDiff", "CEU"), ("GA", "GD", "CE-U"))}
    assert cells[("GradAscent", "GradDiff", "CEU")] == cells[("GA", "GD", "CE-U")]
    assert [m for m, _, _ in cells[("GA", "GD", "CE-U")]] == ["GA", "GD", "CE-U"]
    assert [e["method"] for e in configured_methods({**raw, "methods": ["GradDiff", {"method": "CEU"}]})] == [
        "GD", "CE-U"]


def test_another_name_a_plugin_has_is_refused():
    class Claims(api.Method):
        name = "Claimant"
        known_as = ("GradAscent",)

    with pytest.raises(PluginError, match=r"^method 'Claimant' is known as 'GradAscent', as method 'GA' is: drop it "
                                          r"from one's known_as, or uninstall one$"):
        plugins.methods.register(Claims())
    assert "Claimant" not in plugins.methods and plugins.methods.canonical("GradAscent") == "GA"
    with pytest.raises(PluginError, match=r"^method 'Shadow' is known as 'ga', the name of method 'GA': drop it "
                                          r"from 'Shadow''s known_as, or uninstall one$"):
        plugins.methods.register(type("Shadow", (api.Method,), {"name": "Shadow", "known_as": ("ga",)})())
    assert plugins.methods.get("ga").name == "GA" and not plugins.methods.broken()


def test_an_installed_plugins_other_name_clash_is_filed_under_the_plugin_that_declares_it(monkeypatch):
    """Installed plugins (entry points) are not refused but kept aside: a plugin known by another plugin's name is
    unusable under its own name, in one line naming both, and the plugin whose name it claimed stays usable; two
    plugins claiming one other name are both kept aside (as two plugins of one name are), each naming the other."""
    from importlib.metadata import EntryPoint

    class Shadow(api.Method):
        name = "Shadow"
        known_as = ("Original",)

    class Twin(api.Method):
        name = "Twin"
        known_as = ("Double",)

    class Other(api.Method):
        name = "Other"
        known_as = ("double",)

    class Original(api.Method):
        name = "Original"

    found = {"Shadow": Shadow(), "Twin": Twin(), "Other": Other(), "Original": Original()}
    monkeypatch.setattr(EntryPoint, "load", lambda self: found[self.name])
    registry = plugins.Registry("method", "cru_test_methods")
    points = [EntryPoint(name, f"fake:{name}", "cru_test_methods") for name in found]
    monkeypatch.setattr(plugins, "entry_points", lambda group: points if group == "cru_test_methods" else [])
    assert registry.names() == ["Original"]
    assert registry.broken() == {
        "shadow": "method 'Shadow' is known as 'Original', the name of method 'Original': drop it from 'Shadow''s "
                  "known_as, or uninstall one",
        "twin": "method 'Twin' is known as 'Double', as method 'Other' is: drop it from one's known_as, or uninstall one",
        "other": "method 'Other' is known as 'double', as method 'Twin' is: drop it from one's known_as, or uninstall "
                 "one"}
    with pytest.raises(PluginError, match=r"^method 'Shadow' is known as 'Original', the name of method 'Original'"):
        registry.get("shadow")
    assert registry.get("original") is found["Original"] and registry.known_as() == {}
    with pytest.raises(UnknownPluginError, match=r"unknown method 'Double'.*not usable: .*as method 'Other' is"):
        registry.get("Double")


def test_the_logit_lens_named_as_an_attack_says_where_it_is():
    """It is a metric (`evaluation.logit_lens`, `cru-harness lens`), not a registered attack: the error says so."""
    for name in ("logit_lens", "lens"):
        with pytest.raises(UnknownPluginError,
                           match=r"is not a registered attack: the logit lens .*evaluation\.logit_lens: true"):
            plugins.attacks.get(name)
    assert "logit_lens" not in plugins.attacks.names()


def test_a_registered_object_must_be_of_its_kind():
    class NotAMethod:
        name = "Fake"

    with pytest.raises(PluginError, match="is not a cru_harness.api.Method"):
        plugins.methods.register(NotAMethod())
    with pytest.raises(PluginError, match="already registered"):
        plugins.methods.register(type("Other", (api.Method,), {"name": "ga"})())


def test_the_runner_reads_a_method_from_its_plugin(tmp_path):
    """A method registered in-process is configurable at once: its dataclass's fields are its keys, its
    per-benchmark defaults enter the cells' hyperparameters, and a value the dataclass refuses is refused by the
    config, naming the key."""
    from dataclasses import dataclass

    from cru_harness.runner.plan import build_plan

    @dataclass
    class ToyConfig:
        strength: float = 1.0
        passes: int = 1

        def __post_init__(self):
            if self.strength <= 0:
                raise ValueError(f"strength must be > 0, got {self.strength}")

    class Toy(api.Method):
        name = "ToyMethod"
        config = ToyConfig
        benchmark_defaults = {"tofu": {"passes": 3}}

    plugins.methods.register(Toy())
    try:
        raw = {"name": "t", "output_dir": str(tmp_path), "models": [{"name": "m", "path": "zoo:llama"}],
               "seeds": [0, 1],
               "benchmarks": {"tofu": {"splits": ["forget01"]}}, "methods": [{"method": "toymethod", "strength": 2}]}
        cells = [c for c in build_plan(cfg.validate_config(raw)) if c.kind == "method"]
        assert [(c.method, c.seed, c.hparams) for c in cells] == [("ToyMethod", 0, {"passes": 3, "strength": 2}),
                                                                   ("ToyMethod", 1, {"passes": 3, "strength": 2})]
        with pytest.raises(cfg.ConfigError, match=r"methods\[0\]: ToyMethod: strength must be > 0"):
            cfg.validate_config({**raw, "methods": [{"method": "ToyMethod", "strength": -1}]})
        with pytest.raises(cfg.ConfigError, match=r"methods\[0\]\.steps: not a hyperparameter of ToyMethod"):
            cfg.validate_config({**raw, "methods": [{"method": "ToyMethod", "steps": 1}]})
    finally:
        plugins.methods.unregister("ToyMethod")
    assert "ToyMethod" not in plugins.methods.names()


def test_attack_cells_are_planned_per_method_cell_and_keyed_by_it(tmp_path):
    from cru_harness.runner.plan import build_plan

    raw = {"name": "t", "output_dir": str(tmp_path), "models": [{"name": "m", "path": "zoo:llama"}], "seeds": [0],
           "benchmarks": {"tofu": {"splits": ["forget01"]}}, "methods": ["GA", "CRU"]}
    plain = build_plan(cfg.validate_config(raw))
    attacked = build_plan(cfg.validate_config({**raw, "attacks": ["identity"]}))
    assert [c.hash for c in attacked[:len(plain)]] == [c.hash for c in plain]   # no other cell's hash moves
    extra = attacked[len(plain):]
    # the Original under each attack is its control (what the attack does to the model before unlearning)
    assert [(c.kind, c.label) for c in extra] == [("attack", "GA + identity"), ("attack", "CRU + identity"),
                                                  ("attack", "Original + identity")]
    targets = {c.hash: c for c in plain}
    assert [targets[c.extra["attacked"]].label for c in extra] == ["GA", "CRU", "Original"]
    lr = {**raw, "attacks": ["identity"], "methods": [{"method": "GA", "learning_rate": 1e-3}, "CRU"]}
    moved = build_plan(cfg.validate_config(lr))
    assert moved[len(plain)].hash != extra[0].hash and moved[len(plain) + 1].hash == extra[1].hash
    assert moved[len(plain) + 2].hash == extra[2].hash   # the control does not depend on a method's settings
    from cru_harness.runner.cli import plan_summary

    summary = plan_summary(cfg.validate_config({**raw, "attacks": ["identity"]}), attacked)
    assert (summary["n_trained"], summary["n_attacked"], summary["n_evaluated"]) == (len(plain) - 1, 3, len(attacked))
    # detach has nothing to remove from GA's weights or the oracle's: only the adapter method's cell is attacked
    oracle = {**raw, "models": [{"name": "m", "path": "zoo:llama", "retain": {"checkpoint": "zoo:llama:retain"}}]}
    detached = build_plan(cfg.validate_config({**oracle, "attacks": ["detach", "identity"]}))
    assert [c.label for c in detached if c.kind == "attack"] == [
        "CRU + detach", "Retain + identity", "GA + identity", "CRU + identity", "Original + identity"]


PLUGIN_PACKAGE = '''
"""A plugin distribution defined outside cru-harness: a benchmark, a method and an attack."""
from cru_harness.api import Attack, Method, Trained
from cru_harness.benchmarks.tofu import TOFU


class ForgetOnlyTOFU(TOFU):
    """TOFU scored on its forget split and privacy alone (a benchmark variant another package ships)."""
    name = "tofu_forget_only"
    summary = "TOFU, forget split and privacy only"
    default_tasks = ("tofu_{split}", "tofu_privacy_{split}")
    order = 50


class Untouched(Method):
    """The model as it is: a method that unlearns nothing (its rows must equal Original's)."""
    name = "Untouched"
    summary = "changes nothing"
    seeded = False
    reads_corpora = False
    trains = False

    def run(self, ctx):
        ctx.outcome["resources"]["trainable_params"] = 0
        return Trained(ctx.model_path)


class Replay(Attack):
    """Serves the attacked cell's model again (its numbers must equal the cell's)."""
    name = "replay"
    summary = "the cell's model again"

    def run(self, ctx):
        return Trained(ctx.model_path, routers=ctx.routers)


BENCHMARK = ForgetOnlyTOFU()
METHOD = Untouched()
ATTACK = Replay()
'''

PLUGIN_PYPROJECT = '''
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "cru-toy-plugin"
version = "0.0.1"

[project.entry-points."cru_harness.benchmarks"]
tofu_forget_only = "cru_toy_plugin:BENCHMARK"

[project.entry-points."cru_harness.methods"]
Untouched = "cru_toy_plugin:METHOD"

[project.entry-points."cru_harness.attacks"]
replay = "cru_toy_plugin:ATTACK"

[tool.setuptools]
py-modules = ["cru_toy_plugin"]
'''


def install_plugin(source: Path, root: Path) -> dict[str, str]:
    """Build and install the package at `source` with pip (no build isolation, no index: offline) into root/site,
    and return the environment of a `cru-harness` process that finds it there."""
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(source)], check=True, capture_output=True, timeout=300)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.slow
def test_a_plugin_distribution_runs_end_to_end(tmp_path):
    """Built with pip (no build isolation: offline) and installed into a directory on the run's path, the plugin's
    benchmark, method and attack are listed by `cru-harness`, validated, run and reported like the built-ins."""
    source = tmp_path / "plugin"
    source.mkdir()
    (source / "cru_toy_plugin.py").write_text(PLUGIN_PACKAGE)
    (source / "pyproject.toml").write_text(PLUGIN_PYPROJECT)
    env = install_plugin(source, tmp_path)
    cli = [sys.executable, "-m", "cru_harness"]

    listed = subprocess.run([*cli, "methods"], env=env, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0 and "Untouched" in listed.stdout, listed.stderr

    config = tmp_path / "plugin_run.yaml"
    out = tmp_path / "run"
    config.write_text(textwrap.dedent(f"""
        name: plugin_run
        output_dir: {out}
        seeds: [0]
        device: cpu
        models: [{{name: tiny, path: "zoo:llama:finetuned", dtype: float32}}]
        benchmarks:
          tofu_forget_only: {{data_dir: "testbed:world", splits: [forget01], limit: 4}}
        methods: [Untouched]
        attacks: [replay]
        evaluation: {{batch_size: 4, failure_classes: false}}
        report: {{formats: [md], plots: false, stats: false}}
    """))
    done = subprocess.run([*cli, "run", str(config)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = {r["label"]: r for r in (json.loads(p.read_text()) for p in (out / "cells").glob("*/result.json"))}
    # the attack on the method cell, and on the Original: its control (what the attack does to the model before
    # unlearning)
    assert set(results) == {"Original", "Untouched", "Untouched + replay", "Original + replay"}
    assert all(r["status"] == "ok" and r["benchmark"] == "tofu_forget_only" for r in results.values())
    assert results["Untouched + replay"]["kind"] == "attack"
    forget = {label: r["metrics"]["forget_rouge_l"] for label, r in results.items()}
    assert isinstance(forget["Original"], float)
    assert forget["Untouched"] == forget["Original"] == forget["Untouched + replay"] == forget["Original + replay"]
    # the privacy task ran: MIA AUCs recorded, privleak against 0.5 (no retain cell here), said so
    untouched = results["Untouched"]
    assert isinstance(untouched["metrics"]["mia_auc_min_k"], float) and untouched["metrics"]["privleak"] is not None
    assert "no retain cell" in untouched["details"]["scoring"]["privleak"]["retain_source"]
    table = (out / "report" / "leaderboard_tofu_forget_only.md").read_text()
    assert "| Untouched |" in table and "replay" not in table     # attack cells have a table of their own
    report = (out / "report" / "report.md").read_text()
    assert "### Robustness" in report and "| Untouched | replay |" in report
