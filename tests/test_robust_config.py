"""Issue 9: config booleans are booleans, and a dry run shows every model the run loads and whether it runs
remote code."""
import re

import pytest
import yaml

from cru_harness.runner import config as cfg


def raw_config(tmp_path, **model):
    return {"name": "t", "output_dir": str(tmp_path / "run"),
            "models": [{"name": "m", "path": "zoo:llama", **model}],
            "benchmarks": {"tofu": {"splits": ["forget01"]}}, "methods": [{"method": "GA"}]}


@pytest.mark.parametrize("value", ["false", "true", "no", 0, 1, "False"])
def test_trust_remote_code_takes_booleans_only(tmp_path, value):
    with pytest.raises(cfg.ConfigError) as info:
        cfg.validate_config(raw_config(tmp_path, trust_remote_code=value))
    assert info.value.key == "models[0].trust_remote_code"
    assert f"expected true or false (a YAML boolean, unquoted), got {value!r}" in str(info.value)


@pytest.mark.parametrize("where, key", [
    (lambda r, v: r.update(include_original=v), "include_original"),
    (lambda r, v: r["models"][0].update(chat_template=v), "models[0].chat_template"),
    (lambda r, v: r.update(evaluation={"failure_classes": v}), "evaluation.failure_classes"),
    (lambda r, v: r.update(evaluation={"apply_chat_template": v}), "evaluation.apply_chat_template"),
    (lambda r, v: r.update(report={"plots": v}), "report.plots"),
    (lambda r, v: r.update(report={"stats": v}), "report.stats"),
])
def test_every_config_boolean_rejects_a_string(tmp_path, where, key):
    raw = raw_config(tmp_path)
    where(raw, "false")
    with pytest.raises(cfg.ConfigError) as info:
        cfg.validate_config(raw)
    assert info.value.key == key and "got 'false'" in str(info.value)


def test_real_booleans_are_kept(tmp_path):
    assert cfg.validate_config(raw_config(tmp_path, trust_remote_code=True)).models[0].trust_remote_code is True
    assert cfg.validate_config(raw_config(tmp_path, trust_remote_code=False)).models[0].trust_remote_code is False
    assert cfg.validate_config(raw_config(tmp_path)).models[0].trust_remote_code is False


def test_dry_run_shows_what_is_loaded_and_trust_remote_code(tmp_path, capsys):
    from cru_harness.cli import main

    raw = raw_config(tmp_path, trust_remote_code=True, retain={"checkpoint": "org/retain-model"})
    raw["models"].append({"name": "n", "path": str(tmp_path)})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "models[0] m: zoo:llama (built-in testbed model), trust_remote_code: true" in out
    assert ("models[0].retain.forget01 m retain forget01: org/retain-model (Hugging Face Hub), "
            "trust_remote_code: true") in out
    assert f"models[1] n: {tmp_path} (local path), trust_remote_code: false" in out
    # A quoted "false" never reaches the plan: the dry run stops on it, naming the key.
    raw["models"][1]["trust_remote_code"] = "false"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--dry-run"]) == 2
    assert "models[1].trust_remote_code: expected true or false" in capsys.readouterr().err


def test_dry_run_warns_of_a_local_model_or_a_device_this_machine_lacks(tmp_path, capsys, monkeypatch):
    """The dry run, which validates without loading a model, says in one line each what would fail a run's cells
    on this machine: a local model path that is not a model directory (locations.check_model_path), a device it
    lacks (devices.resolve_device, the rule the cells load models by). Warnings, exit 0: the plan may be for
    another machine."""
    import torch

    from cru_harness import devices
    from cru_harness.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "load_causal_lm", lambda *a, **k: pytest.fail("the dry run loaded a model"))
    good = tmp_path / "good"
    good.mkdir()
    (good / "config.json").write_text("{}")
    raw = raw_config(tmp_path, retain={"checkpoint": str(good)})
    raw["models"] += [{"name": "n", "path": str(good)}, {"name": "h", "path": "org/model"}]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--dry-run"]) == 0
    assert capsys.readouterr().err == ""   # a built-in model, a model directory, a Hub id: nothing to say
    raw["device"] = "cuda"
    raw["models"][0]["retain"] = {"checkpoint": str(tmp_path / "gone")}
    raw["models"][1]["path"] = str(tmp_path)   # a directory, but no model's
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "experiment t: " in out  # still planned
    prefix = f"warning: a run on this machine would fail: {path}: "
    lines = err.splitlines()
    assert lines[:2] == [
        f"{prefix}models[0].retain.forget01: model {tmp_path / 'gone'} does not exist (no such directory)",
        (f"{prefix}models[1]: model directory {tmp_path} holds no config.json: not a Hugging Face model "
         "checkpoint (save one with save_pretrained)")]
    assert len(lines) == 3 and lines[2].startswith(f"{prefix}device: device 'cuda': ") and "CUDA" in lines[2]
    (tmp_path / "run").write_text("x")   # output_dir is a file here
    assert main(["run", str(path), "--dry-run", "--output-dir", str(tmp_path / "run")]) == 0
    assert (f"warning: a run on this machine would fail: output_dir {tmp_path / 'run'} exists and is not a "
            "directory") in capsys.readouterr().err


def test_a_config_path_that_is_a_directory_says_so(tmp_path, capsys):
    from cru_harness.cli import main

    assert main(["run", str(tmp_path), "--dry-run"]) == 2
    assert capsys.readouterr().err.strip().endswith(f"{tmp_path} is a directory, not a config file (a YAML file "
                                                    "such as configs/demo.yaml)")


@pytest.mark.parametrize("extra", [[], ["--output-dir", "out"]])
def test_a_config_that_is_not_a_mapping_is_one_line(tmp_path, capsys, extra):
    from cru_harness.cli import main

    path = tmp_path / "list.yaml"
    path.write_text("- name: t\n- models: []\n")
    assert main(["run", str(path), *extra]) == 2
    assert capsys.readouterr().err == (f"cru-harness run: error: {path}: expected a mapping of settings (name, "
                                       "models, benchmarks, methods, ...) at the top level, got a list\n")


def test_cru_prefix_cache_hparams_are_validated(tmp_path):
    """CRU's prefix-cache switches are hyperparameters a config may set (the runner passes them to
    RouterTrainingConfig); a quoted boolean or an unknown placement is refused naming the key."""
    raw = raw_config(tmp_path)
    raw["methods"] = [{"method": "CRU", "prefix_cache": False, "prefix_cache_placement": "cpu",
                       "final_retain_rows": 200}]
    method = cfg.validate_config(raw).methods[0]
    assert method.hparams == {"prefix_cache": False, "prefix_cache_placement": "cpu", "final_retain_rows": 200}
    raw["methods"] = [{"method": "CRU", "prefix_cache": "false"}]
    with pytest.raises(cfg.ConfigError) as info:
        cfg.validate_config(raw)
    assert info.value.key == "methods[0].prefix_cache" and "got 'false'" in str(info.value)
    raw["methods"] = [{"method": "CRU", "prefix_cache_placement": "gpu"}]
    with pytest.raises(cfg.ConfigError, match="expected one of auto, cpu, device"):
        cfg.validate_config(raw)


def test_cru_percentile_100_is_refused(tmp_path):
    """p is the percentile *above* which coordinates are selected: at 100 nothing would be selected."""
    raw = raw_config(tmp_path)
    raw["methods"] = [{"method": "CRU", "percentile": 99.5}]
    assert cfg.validate_config(raw).methods[0].hparams == {"percentile": 99.5}
    raw["methods"] = [{"method": "CRU", "percentile": 100}]
    with pytest.raises(cfg.ConfigError, match="must be < 100"):
        cfg.validate_config(raw)


@pytest.mark.parametrize("spec, message", [
    (True, "expected RWKU target indices, got True"),
    ([3.7, 2], "expected an integer target index, got 3.7"),
    (["2"], "expected an integer target index, got '2'"),
    ("1-x", "neither a number nor a range"),
    ("5-2", "start is after end"),
    ("0,3", "run from 1 to 200"),
    ({"a": 1}, "expected RWKU targets like"),
])
def test_rwku_targets_have_one_parser_for_configs_and_tasks(tmp_path, spec, message):
    """The runner's config and the lm-eval tasks read targets by the same rule (benchmarks.rwku.data.parse_targets): the
    same spec is refused with the same reason, at the config's key there."""
    from cru_harness.benchmarks.rwku.data import TargetSelectionError, parse_targets

    with pytest.raises(TargetSelectionError, match=re.escape(message)):
        parse_targets(spec)
    raw = {"name": "t", "output_dir": str(tmp_path / "out"), "models": [{"name": "m", "path": "smollm2"}],
           "benchmarks": {"rwku": {"targets": spec}}, "methods": [{"method": "GA"}]}
    with pytest.raises(cfg.ConfigError, match=r"benchmarks\.rwku\.targets: .*" + re.escape(message)):
        cfg.validate_config(raw)


def test_rwku_targets_keep_their_order_for_tasks_and_sort_for_configs(tmp_path):
    from cru_harness.benchmarks.rwku.data import parse_targets

    assert parse_targets("5,1-2") == [5, 1, 2]
    raw = {"name": "t", "output_dir": str(tmp_path / "out"), "models": [{"name": "m", "path": "smollm2"}],
           "benchmarks": {"rwku": {"targets": "5,1-2"}}, "methods": [{"method": "GA"}]}
    assert cfg.validate_config(raw).benchmarks["rwku"]["targets"] == [1, 2, 5]
