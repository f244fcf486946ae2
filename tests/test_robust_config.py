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
    """The runner's config and the lm-eval tasks read targets by the same rule (data.rwku.parse_targets): the
    same spec is refused with the same reason, at the config's key there."""
    from cru_harness.data.rwku import TargetSelectionError, parse_targets

    with pytest.raises(TargetSelectionError, match=re.escape(message)):
        parse_targets(spec)
    raw = {"name": "t", "output_dir": str(tmp_path / "out"), "models": [{"name": "m", "path": "smollm2"}],
           "benchmarks": {"rwku": {"targets": spec}}, "methods": [{"method": "GA"}]}
    with pytest.raises(cfg.ConfigError, match=r"benchmarks\.rwku\.targets: .*" + re.escape(message)):
        cfg.validate_config(raw)


def test_rwku_targets_keep_their_order_for_tasks_and_sort_for_configs(tmp_path):
    from cru_harness.data.rwku import parse_targets

    assert parse_targets("5,1-2") == [5, 1, 2]
    raw = {"name": "t", "output_dir": str(tmp_path / "out"), "models": [{"name": "m", "path": "smollm2"}],
           "benchmarks": {"rwku": {"targets": "5,1-2"}}, "methods": [{"method": "GA"}]}
    assert cfg.validate_config(raw).benchmarks["rwku"]["targets"] == [1, 2, 5]
