"""The step after the quickstart, on the testbed's tiny Llama: every command that takes a model takes the testbed names
(`zoo:llama:finetuned`) through the one resolver, and a trained model's directory records its base, its method and
the prompt format it trained on, which `--prompt-format auto` reads before the tokenizer's chat template."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)  # 2 shared cores

from cru_harness.cli import main  # noqa: E402
from cru_harness.prompts import recorded_prompt_format  # noqa: E402
from cru_harness.testbed.names import prompt_format_for, trained_prompt_format  # noqa: E402
from cru_harness.testbed.zoo import tiny_checkpoint  # noqa: E402

FAST = ["--set", "num_epochs=1", "--set", "effective_batch_size=4", "--set", "micro_batch_size=4"]


@pytest.fixture(scope="module")
def base():
    return tiny_checkpoint("llama")


@pytest.fixture(scope="module")
def unlearned(base, tmp_path_factory):
    """GA from `zoo:llama:finetuned` on the testbed world, as `cru-harness unlearn --method` writes it."""
    out = tmp_path_factory.mktemp("ga") / "ga"
    assert main(["unlearn", "--method", "GA", "--base", "zoo:llama:finetuned", "--data-dir", "testbed:world",
                 "--forget", "forget01", "--retain", "retain99", "--out", str(out), *FAST, "--no-progress",
                 "--device", "cpu"]) == 0
    return out


def test_recorded_prompt_format_reads_each_record_and_nothing_else(tmp_path):
    assert recorded_prompt_format(tmp_path) is None and recorded_prompt_format("org/model") is None
    (tmp_path / "finetune_record.json").write_text(json.dumps({"chat_template": False, "family": None}))
    assert recorded_prompt_format(tmp_path) == "plain"   # a record written before `prompt_format` existed
    (tmp_path / "finetune_record.json").write_text(json.dumps({"chat_template": True, "prompt_format": "phi-1_5"}))
    assert recorded_prompt_format(tmp_path) == "phi-1_5"
    attacked = tmp_path / "attack" / "relearned"
    attacked.mkdir(parents=True)
    (tmp_path / "attack" / "attack_record.json").write_text(json.dumps(
        {"attacked_model": str(attacked), "prompt_format": "plain"}))
    assert recorded_prompt_format(attacked) == "plain"
    other = tmp_path / "attack" / "other"
    other.mkdir()
    assert recorded_prompt_format(other) is None   # the record names another folder
    assert prompt_format_for("auto", tmp_path) == {"chat": False, "family": "phi-1_5"}
    assert prompt_format_for("auto", tmp_path, "rwku") == {"chat": False, "benchmark": "rwku"}
    assert prompt_format_for("chat", tmp_path) == {"chat": True, "family": None}   # a given format wins
    assert prompt_format_for("auto", "zoo:llama:finetuned") == {"chat": False, "family": None}
    assert prompt_format_for("auto", "org/model") == {"chat": None, "family": None}
    (tmp_path / "finetune_record.json").write_text(json.dumps({"prompt_format": "llama2-7b"}))   # a legacy family
    assert prompt_format_for("auto", tmp_path) == {"chat": None, "family": None}   # then the tokenizer decides


def test_unlearn_records_its_base_method_and_prompt_format(unlearned, base):
    record = json.loads((unlearned / "unlearn_record.json").read_text())
    assert record["method"] == "ga" and record["base_model"] == str(base) and record["prompt_format"] == "plain"
    # the tokenizer it saved has the zoo's chat template: without the record, auto would prompt it as chat
    assert (unlearned / "chat_template.jinja").is_file() or "chat_template" in (
        unlearned / "tokenizer_config.json").read_text()
    assert trained_prompt_format(unlearned) == "plain"


def test_attack_relearns_a_testbed_model_by_name_on_the_format_it_learned(unlearned, tmp_path, capsys):
    """The attack command takes `zoo:` names (no Hub traceback), relearns an unlearned model on the prompt the
    model learned, records that format, and prints how to score the attacked model."""
    out = tmp_path / "zoo_relearn"
    assert main(["attack", "--attack", "relearn", "--model", "zoo:llama:finetuned", "--forget-corpus", "forget01",
                 "--data-dir", "testbed:world", "--out", str(out), "--set", "slice_size=1", "--set", "num_epochs=1",
                 "--device", "cpu"]) == 0, capsys.readouterr().err
    record = json.loads((out / "attack_record.json").read_text())
    assert record["model"] == "zoo:llama:finetuned" and record["prompt_format"] == "plain"
    printed = capsys.readouterr().out
    assert (f"score it: lm_eval --model cru --model_args base={record['attacked_model']} --tasks tofu_forget01_suite "
            f"--metadata '{{\"data_dir\": \"testbed:world\"}}'") in printed
    assert "--apply_chat_template" not in printed and f"cru-harness score {out / 'lm_eval'}" in printed
    assert trained_prompt_format(record["attacked_model"]) == "plain"

    again = tmp_path / "ga_relearn"
    assert main(["attack", "--attack", "relearn", "--model", str(unlearned), "--forget-corpus", "forget01",
                 "--data-dir", "testbed:world", "--out", str(again), "--set", "slice_size=1", "--set", "num_epochs=1",
                 "--device", "cpu"]) == 0, capsys.readouterr().err
    assert json.loads((again / "attack_record.json").read_text())["prompt_format"] == "plain"


def test_quantize_and_lens_take_testbed_names(tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["attack", "--attack", "quantize", "--model", "zoo:llama:finetuned", "--out", str(out),
                 "--set", "weights=int8", "--device", "cpu"]) == 0, capsys.readouterr().err
    assert Path(json.loads((out / "attack_record.json").read_text())["attacked_model"]).parent == out
    capsys.readouterr()
    assert main(["lens", "--model", "zoo:llama:finetuned", "--data", "forget01", "--data-dir", "testbed:world",
                 "--limit", "1", "--device", "cpu"]) == 0, capsys.readouterr().err
    assert "logit lens of zoo:llama:finetuned" in capsys.readouterr().out
