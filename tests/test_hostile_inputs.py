"""Issue 48: bad inputs, tried as a hostile or careless user would, organised by the issue's classes (one test class
per class), so that a new instance of a class meets the check of the whole class. Fast: unit-level checks of the
validation functions, test doubles for executors, a config.json-only directory where a model path is needed; no
model is loaded or trained."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


class StopBeforeLoading(Exception):
    """Raised by the stand-in for HFLM.__init__: construction got as far as loading the base."""


@pytest.fixture
def fake_model_dir(tmp_path) -> Path:
    """A directory `check_model_path` takes for a local model (it holds a config.json); nothing loads it."""
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture
def hflm_calls(monkeypatch) -> list[dict]:
    """HFLM.__init__ replaced: records the arguments the base would be loaded with, then stops."""
    calls = []

    def record(self, *args, **kwargs):
        calls.append(kwargs)
        raise StopBeforeLoading

    monkeypatch.setattr("lm_eval.models.huggingface.HFLM.__init__", record)
    return calls


# --------------------------------------------------------------------------------------------------- class 1
class TestBooleanModelArguments:
    """Class 1: every boolean in `--model_args` takes exactly lm-eval's spellings; `trust_remote_code=no` ran the
    checkpoint's Python because a non-empty string is true."""

    @pytest.mark.parametrize("text", ["no", "yes", "0", "1", "off", "on", "'no'", "n"])
    def test_other_spellings_are_refused_naming_the_argument(self, text, fake_model_dir, hflm_calls):
        from lm_eval.utils import simple_parse_args_string

        from cru_harness.lmeval.arguments import ModelArgumentError
        from cru_harness.lmeval.model import CRULM

        args = simple_parse_args_string(f"base={fake_model_dir},trust_remote_code={text}")  # as lm_eval parses it
        with pytest.raises(ModelArgumentError, match=r"trust_remote_code=.* in --model_args is not a boolean: "
                                                     r"write trust_remote_code=true or trust_remote_code=false"):
            CRULM(device="cpu", **args)
        assert hflm_calls == []

    @pytest.mark.parametrize("text, value", [("false", False), ("False", False), ("FALSE", False),
                                             ("true", True), ("True", True)])
    def test_lm_evals_spellings_reach_the_model_as_bools(self, text, value, fake_model_dir, hflm_calls):
        from lm_eval.utils import simple_parse_args_string

        from cru_harness.lmeval.model import CRULM

        args = simple_parse_args_string(f"base={fake_model_dir},trust_remote_code={text},parallelize={text}")
        with pytest.raises(StopBeforeLoading):
            CRULM(device="cpu", **args)
        assert hflm_calls[0]["trust_remote_code"] is value and hflm_calls[0]["parallelize"] is value

    def test_every_boolean_argument_is_checked_and_strings_from_python_are_normalised(self):
        from cru_harness.lmeval.arguments import ModelArgumentError, boolean_arguments, check_boolean_arguments

        names = boolean_arguments()
        # HFLM's, from_pretrained's (by annotation) and from_pretrained's **kwargs booleans
        assert {"trust_remote_code", "parallelize", "use_fast_tokenizer", "local_files_only", "load_in_8bit",
                "low_cpu_mem_usage"} <= names
        assert "batch_size" not in names and "autogptq" not in names   # not booleans only
        for name in sorted(names):
            with pytest.raises(ModelArgumentError, match=f"{name}='no'"):
                check_boolean_arguments({name: "no"})
            with pytest.raises(ModelArgumentError, match=f"{name}=1 "):
                check_boolean_arguments({name: 1})
        kwargs = {"trust_remote_code": " TRUE ", "parallelize": None, "logits_cache": False}
        check_boolean_arguments(kwargs)
        assert kwargs == {"trust_remote_code": True, "parallelize": None, "logits_cache": False}


# --------------------------------------------------------------------------------------------------- class 2
def write_run_config(tmp_path: Path, name: str = "t", **extra) -> Path:
    """A config whose model is a local path (nothing to build); the executors here are test doubles."""
    raw = {"name": name, "output_dir": str(tmp_path / "run"), "seeds": [0],
           "models": [{"name": "m", "path": str(tmp_path)}], "benchmarks": {"tofu": {"splits": ["forget01"]}},
           "methods": [{"method": "GA"}], **extra}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def fake_executor(calls: list):
    def executor(cell, workdir):   # test double: no model
        calls.append(cell.hash)
        return {"metrics": {"forget_rouge_l": 0.5}}
    return executor


class TestOutputDirectory:
    """Class 2: `run` into a directory holding someone else's files overwrote their plan.json and report/ (a dry
    run said nothing); `--output-dir /` wrote /cells. A run resumes only in an empty directory or a run of its
    own experiment; anything else is refused before any work, a dry run included, naming what is there."""

    @pytest.mark.parametrize("dry_run", [True, False])
    def test_a_directory_of_someone_elses_files_is_refused_and_left_as_it_was(self, tmp_path, capsys, dry_run):
        from cru_harness.cli import main

        theirs = tmp_path / "theirs"
        (theirs / "report").mkdir(parents=True)
        (theirs / "plan.json").write_text("my travel plan")
        (theirs / "notes.txt").write_text("keep me")
        before = {p: p.read_bytes() for p in theirs.rglob("*") if p.is_file()}
        path = write_run_config(tmp_path, output_dir=str(theirs))
        assert main(["run", str(path), "--no-report", *(["--dry-run"] if dry_run else [])]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"cru-harness run: error: output_dir {theirs} holds a "
                                                   "plan.json that cannot be read")
        assert {p: p.read_bytes() for p in theirs.rglob("*") if p.is_file()} == before
        (theirs / "plan.json").unlink()
        assert main(["run", str(path), "--no-report", "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert "is not empty and is not a cru-harness run (it holds notes.txt)" in err
        assert sorted(p.name for p in theirs.iterdir()) == ["notes.txt", "report"]

    @pytest.mark.parametrize("dry_run", [True, False])
    def test_an_overlap_study_into_someone_elses_files_is_refused(self, tmp_path, capsys, dry_run):
        """The overlap study writes cells/ without going through `run`: it checks its directory as a run does."""
        from cru_harness.cli import main

        theirs = tmp_path / "theirs"
        theirs.mkdir()
        (theirs / "notes.txt").write_text("keep me")
        path = write_run_config(tmp_path, output_dir=str(theirs), methods=[{"method": "CRU"}],
                                study={"kind": "overlap", "title": "t", "examples": [4]})
        assert main(["study", str(path), *(["--dry-run"] if dry_run else [])]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is not empty and is not a cru-harness run (it holds notes.txt)" in err[0], err
        assert [p.name for p in theirs.iterdir()] == ["notes.txt"]

    def test_another_experiments_run_is_refused_its_own_resumes(self, tmp_path):
        from cru_harness.locations import OutputLocationError
        from cru_harness.runner import config as cfg
        from cru_harness.runner.cli import run_config

        mine = cfg.load_config(write_run_config(tmp_path, name="mine"))
        calls = []
        assert run_config(mine, executor=fake_executor(calls), report=False, log=lambda _: None) == 0
        computed = len(calls)
        assert run_config(mine, executor=fake_executor(calls), report=False, log=lambda _: None) == 0
        assert len(calls) == computed   # the second run resumed: its cells were done
        other = cfg.load_config(write_run_config(tmp_path, name="other"))
        plan = (mine.output_dir / "plan.json").read_bytes()
        for dry_run in (True, False):
            with pytest.raises(OutputLocationError, match=r"holds the run of another experiment \('mine', not "
                                                          r"'other'\)"):
                run_config(other, executor=fake_executor(calls), report=False, dry_run=dry_run,
                           log=lambda _: None)
        assert (mine.output_dir / "plan.json").read_bytes() == plan and len(calls) == computed

    def test_what_a_run_writes_alone_is_a_run_directory(self, tmp_path):
        from cru_harness.store import check_run_directory

        root = tmp_path / "run"
        check_run_directory(root, "t")   # absent
        (root / "cells" / "abc").mkdir(parents=True)
        (root / "target_selection").mkdir()
        (root / ".lock").write_text("")
        (root / ".plan.json.1234.tmp").write_text("")
        check_run_directory(root, "t")   # a run stopped before its plan was written

    @pytest.mark.parametrize("where", ["/", "~"])
    def test_the_root_and_home_directories_are_refused(self, where, tmp_path, monkeypatch, capsys):
        from cru_harness.cli import main

        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        (tmp_path / "home").mkdir()
        path = write_run_config(tmp_path)
        assert main(["run", str(path), "--output-dir", where, "--dry-run"]) == 2
        err = capsys.readouterr().err
        kind = "the file system root" if where == "/" else "the home directory"
        assert f"output_dir {where} is {kind}: give a directory of its own" in err
        assert not (Path(where).expanduser() / "plan.json").exists()

    def test_merge_writes_into_a_run_directory_only(self, tmp_path, capsys):
        from cru_harness.cli import main
        from cru_harness.runner import config as cfg
        from cru_harness.runner.cli import run_config

        config = cfg.load_config(write_run_config(tmp_path))
        assert run_config(config, executor=fake_executor([]), report=False, log=lambda _: None) == 0
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        (theirs / "thesis.tex").write_text("keep me")
        assert main(["merge", str(config.output_dir), "--out", str(theirs), "--no-report"]) == 2
        assert "is not a cru-harness run (it holds thesis.tex)" in capsys.readouterr().err
        assert sorted(p.name for p in theirs.iterdir()) == ["thesis.tex"]
        assert main(["merge", str(config.output_dir), "--out", str(tmp_path / "merged"), "--no-report"]) == 0


# --------------------------------------------------------------------------------------------------- class 3
BOMB_LEVELS = 9   # 10 ** 9 values once expanded, from 11 lines


def alias_bomb(key_path: str) -> str:
    """A config whose `key_path` (a validated key) holds a billion-laughs list of aliases."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, BOMB_LEVELS + 1):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * 10) + "]")
    bomb = "\n".join(lines)
    return bomb + "\n" + key_path.format(bomb=f"*l{BOMB_LEVELS}")


class TestBoundedConfigs:
    """Class 3: alias bombs under validated keys took gigabytes and printed error lines of up to 2 GB, since
    validation walks and echoes the expanded value; deep nesting ended in a RecursionError. Aliases, nesting and
    file size are bounded before validation, and every error message is bounded."""

    @pytest.mark.parametrize("tail", [
        "name: t\nseeds: {bomb}\nmodels: [{{name: m, path: zoo:llama}}]\nbenchmarks: {{tofu: {{}}}}\nmethods: [GA]",
        "name: t\nmodels: [{{name: m, path: zoo:llama, benchmarks: {bomb}}}]\nbenchmarks: {{tofu: {{}}}}\n"
        "methods: [GA]",
        "name: t\nmodels: [{{name: m, path: zoo:llama}}]\nbenchmarks: {{tofu: {{tasks: {bomb}}}}}\nmethods: [GA]",
        "name: t\nmodels: [{{name: m, path: zoo:llama}}]\nbenchmarks: {{tofu: {{}}}}\n"
        "methods: [{{method: CRU, blocks: {bomb}}}]",
    ])
    def test_alias_bombs_are_refused_before_validation(self, tail, tmp_path):
        import time

        from cru_harness.runner.config import ConfigError, load_config

        path = tmp_path / "bomb.yaml"
        path.write_text(alias_bomb(tail))
        start = time.monotonic()
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert time.monotonic() - start < 5
        message = str(info.value)
        assert "stands for more than 100,000 values once its aliases (*name) are expanded" in message
        assert message.startswith(f"{path}: <file>: ") and len(message) < 400 and "\n" not in message

    def test_a_study_config_is_read_the_same_way(self, tmp_path):
        from cru_harness.runner.config import ConfigError
        from cru_harness.studies.config import load_study

        path = tmp_path / "study.yaml"
        path.write_text(alias_bomb("study: {bomb}"))
        with pytest.raises(ConfigError, match="stands for more than 100,000 values"):
            load_study(path)

    @pytest.mark.parametrize("text, words", [
        ("a: " + "[" * 3000 + "]" * 3000, r"nested more than 50 levels deep \(line 1\)"),
        ("a: " + "{b: " * 60 + "1" + "}" * 60, "nested more than 50 levels deep"),
        ("a: &a [1, *a]", "refers to a value that contains it"),
        ("l0: &l0 [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n"
         "l1: &l1 [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[*l0]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
         "nested more than 50 levels deep once its aliases"),
    ], ids=["deep-flow", "deep-mapping", "recursive-alias", "deep-through-aliases"])
    def test_nesting_is_bounded_in_the_text_and_through_aliases(self, text, words, tmp_path):
        from cru_harness.runner.config import ConfigError, load_config

        path = tmp_path / "deep.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=words):
            load_config(path)

    def test_file_size_is_bounded_and_a_few_shared_settings_still_load(self, tmp_path):
        from cru_harness.runner.config import ConfigError, load_config

        path = tmp_path / "big.yaml"
        path.write_text("name: t\n" + "# padding\n" * 200_000)
        with pytest.raises(ConfigError, match=r"big.yaml: <file>: 2,000,008 bytes is more than a config may hold"):
            load_config(path)
        path.write_text("name: t\nmodels: [{name: m, path: zoo:llama}]\nbenchmarks: {tofu: {}}\n"
                        "methods: [{method: GA, lr: &lr 1.0e-05}, {method: NPO, lr: *lr}]\n")
        assert [m.hparams.get("learning_rate") for m in load_config(path).methods] == [1e-05, 1e-05]

    def test_every_error_message_is_bounded(self, tmp_path):
        from cru_harness.runner.config import MAX_MESSAGE, ConfigError, excerpt, load_config

        path = tmp_path / "long.yaml"
        path.write_text("name: " + "x" * 200 + "!" * 500_000 + "\nmodels: []\nbenchmarks: {}\nmethods: []\n")
        with pytest.raises(ConfigError) as info:
            load_config(path)
        message = str(info.value)
        assert message.startswith(f"{path}: name: expected a simple name") and len(message) <= MAX_MESSAGE + 80
        assert "characters left out" in message
        assert excerpt("y" * 1000) == "'" + "y" * 199 + "... (1,002 characters)"
        assert excerpt([1, 2]) == "[1, 2]"


# --------------------------------------------------------------------------------------------------- class 4
class TestEmptyModelArguments:
    """Class 4: `routers=` empty scored the base as if it were CRU (rc 0, no warning). An argument given with no
    value is refused, naming it, before anything loads; leaving `routers` out still gives the base alone."""

    @pytest.mark.parametrize("spec, name", [("routers=", "routers"), ("routers= ", "routers"),
                                            ("routers=,dtype=float32", "routers"), ("dtype=", "dtype"),
                                            ("revision=", "revision")])
    def test_an_empty_argument_is_refused_by_name(self, spec, name, fake_model_dir, hflm_calls):
        from lm_eval.utils import simple_parse_args_string

        from cru_harness.lmeval.arguments import ModelArgumentError
        from cru_harness.lmeval.model import CRULM

        args = simple_parse_args_string(f"base={fake_model_dir},{spec}")
        with pytest.raises(ModelArgumentError, match=f"cru model: {name}= is empty in --model_args"):
            CRULM(device="cpu", **args)
        assert hflm_calls == []

    @pytest.mark.parametrize("routers, words", [([], "routers=\\[\\] names no bundle"),
                                                (False, "routers=False in --model_args is not a bundle")])
    def test_routers_that_name_no_bundle_are_refused(self, routers, words, fake_model_dir, hflm_calls):
        from cru_harness.lmeval.arguments import ModelArgumentError
        from cru_harness.lmeval.model import CRULM

        with pytest.raises(ModelArgumentError, match=words):
            CRULM(base=str(fake_model_dir), routers=routers, device="cpu")
        assert hflm_calls == []

    def test_an_empty_base_is_refused_and_no_routers_means_the_base_alone(self, fake_model_dir, hflm_calls):
        from cru_harness.lmeval.arguments import ModelArgumentError
        from cru_harness.lmeval.model import CRULM

        with pytest.raises(ModelArgumentError, match="base= is empty"):
            CRULM(base="", routers=str(fake_model_dir), device="cpu")
        with pytest.raises(StopBeforeLoading):   # no routers argument at all: the base is loaded as it is
            CRULM(base=str(fake_model_dir), device="cpu")
        assert len(hflm_calls) == 1


# --------------------------------------------------------------------------------------------------- class 5
def make_bundle(directory: Path, **config_changes) -> Path:
    """A small bundle built in code (a fingerprint of a made-up 4-block base with hidden size 8): no model."""
    import torch

    from cru_harness.cru.bundle import BundleConfig, RouterBundle

    fingerprint = {"architecture": "llama", "hidden_size": 8, "num_layers": 4, "vocab_size": 50, "hash": "0" * 16}
    config = BundleConfig(base_model="made-up", fingerprint=fingerprint, block_indices=[2, 3],
                          neurons={2: [0, 5], 3: [1]}, d_r=2, percentile=95.0, lam=1.0, seed=0,
                          base_weights={"block": 3, "parameter": "mlp.up_proj.weight", "numel": 64,
                                        "dtype": "bfloat16", "values": [0.5, -0.25]}, **config_changes)
    torch.manual_seed(0)
    return RouterBundle(config).save_pretrained(directory)


def rewrite_weights(directory: Path, change) -> None:
    """Apply `change(tensors)` to the weights file and record its new SHA-256, as a careful forger would."""
    import hashlib

    from safetensors.torch import load_file, save_file

    from cru_harness.cru.bundle import MANIFEST_NAME, WEIGHTS_NAME

    tensors = load_file(str(directory / WEIGHTS_NAME))
    change(tensors)
    save_file(tensors, str(directory / WEIGHTS_NAME))
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    manifest["weights_sha256"] = hashlib.sha256((directory / WEIGHTS_NAME).read_bytes()).hexdigest()
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))


def edit_bundle_manifest(directory: Path, edit) -> None:
    from cru_harness.cru.bundle import MANIFEST_NAME

    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    edit(manifest)
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))


def one_line_inspect_error(capsys, directory: Path) -> str:
    from cru_harness.cli import main

    assert main(["inspect", str(directory)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cru-harness inspect: error: "), err
    return err[0]


class TestBundles:
    """Class 5: a bundle that `inspect` passes must load and evaluate. Links were followed, NaN and int64 / bool /
    fp16 weights passed (and were cast), malformed `base_weights` and mistyped manifest fields were accepted."""

    def test_a_good_bundle_inspects_and_loads(self, tmp_path, capsys):
        from cru_harness.cli import main
        from cru_harness.cru.bundle import RouterBundle

        directory = make_bundle(tmp_path / "b")
        assert main(["inspect", str(directory)]) == 0 and "router bundle:" in capsys.readouterr().out
        assert RouterBundle.from_pretrained(directory).block_indices == [2, 3]

    @pytest.mark.parametrize("which", ["routers.safetensors", "cru_bundle.json"])
    def test_links_inside_a_bundle_are_refused_before_anything_is_read(self, which, tmp_path, capsys, monkeypatch):
        from cru_harness.cru import bundle as bundle_module

        directory = make_bundle(tmp_path / "b")
        outside = tmp_path / "outside"
        (directory / which).rename(outside)
        (directory / which).symlink_to(outside)
        monkeypatch.setattr(bundle_module, "_sha256", lambda path: pytest.fail(f"hashed {path}"))
        assert f"{directory / which} is a symbolic link" in one_line_inspect_error(capsys, directory)

    def test_a_weights_file_larger_than_its_routers_is_refused_before_hashing(self, tmp_path, capsys, monkeypatch):
        from cru_harness.cru import bundle as bundle_module

        directory = make_bundle(tmp_path / "b")
        with open(directory / "routers.safetensors", "r+b") as handle:
            handle.truncate(20 << 30)   # sparse: 20 GB that take no disk
        monkeypatch.setattr(bundle_module, "_sha256", lambda path: pytest.fail(f"hashed {path}"))
        assert "more than the" in one_line_inspect_error(capsys, directory)

    @pytest.mark.parametrize("change, words", [
        (lambda t: t.__setitem__("block_2.w1.weight", t["block_2.w1.weight"].to(__import__("torch").int64)),
         "tensor block_2.w1.weight is int64, a bundle's weights are float32"),
        (lambda t: t.__setitem__("block_3.w2.bias", t["block_3.w2.bias"] > 0),
         "tensor block_3.w2.bias is bool"),
        (lambda t: t.__setitem__("block_2.w2.weight", t["block_2.w2.weight"].half()),
         "tensor block_2.w2.weight is float16"),
        (lambda t: t["block_3.w1.bias"].__setitem__(0, float("nan")), "tensor block_3.w1.bias holds NaN"),
        (lambda t: t["block_2.w1.weight"].__setitem__((0, 0), float("inf")), "block_2.w1.weight holds NaN or inf"),
    ])
    def test_weights_of_another_dtype_or_not_finite_are_refused_at_load(self, change, words, tmp_path, capsys):
        from cru_harness.cru.bundle import RouterBundle, WeightShapeError

        directory = make_bundle(tmp_path / "b")
        rewrite_weights(directory, change)
        with pytest.raises(WeightShapeError, match=words):
            RouterBundle.from_pretrained(directory)
        assert words in one_line_inspect_error(capsys, directory)   # inspect runs the same load

    @pytest.mark.parametrize("field, value, words", [
        ("base_model", 7, "base_model must be a string, got 7"),
        ("percentile", "95", "percentile must be a number, got '95'"),
        ("lam", None, "lam must be a number, got None"),
        ("seed", 1.5, "seed must be an integer, got 1.5"),
        ("seed", True, "seed must be an integer, got True"),
        ("metrics", [1], "metrics must be an object"),
        ("training", "fast", "training must be an object"),
        ("router_parameters", "many", "router_parameters must be an integer"),
        ("base_parameters", -3, "base_parameters must not be negative"),
        ("library_versions", {"torch": 2}, "library_versions.torch must be a string"),
        ("metrics", {"forget_gate_mean": "low"}, "metrics.forget_gate_mean must be a number"),
        ("training", {"batch_size": "8"}, "training.batch_size must be a number"),
        ("training_data", {"forget": "x"}, "training_data.forget must be an object"),
        ("selection", ["variance"], "selection must be a string"),
        ("percentile", 250.0, "percentile must be in [0, 100]"),
    ])
    def test_every_manifest_field_is_type_checked(self, field, value, words, tmp_path, capsys):
        directory = make_bundle(tmp_path / "b")
        edit_bundle_manifest(directory, lambda m: m.__setitem__(field, value))
        assert words in one_line_inspect_error(capsys, directory)

    def test_a_bundle_error_shows_a_bounded_excerpt_of_the_value(self, tmp_path, capsys):
        directory = make_bundle(tmp_path / "b")
        edit_bundle_manifest(directory, lambda m: m.__setitem__("block_indices", [2] * 100_000))
        line = one_line_inspect_error(capsys, directory)
        assert "block_indices repeats a block: [2, 2," in line and "(300,000 characters)" in line and len(line) < 400

    @pytest.mark.parametrize("sample, words", [
        ({"block": 3}, "base_weights lacks dtype, numel, parameter, values"),
        ({"block": "3", "parameter": "w", "numel": 4, "dtype": "float32", "values": [1.0]},
         "base_weights.block '3' is not an integer"),
        ({"block": 9, "parameter": "w", "numel": 4, "dtype": "float32", "values": [1.0]},
         "base_weights.block 9 is out of range"),
        ({"block": 1, "parameter": "w", "numel": 4, "dtype": "int8", "values": [1.0]},
         "base_weights.dtype must name a torch floating dtype"),
        ({"block": 1, "parameter": "w", "numel": 4, "dtype": "float32", "values": "1,2"},
         "base_weights.values must be a list of 1 to 4 finite numbers"),
        ({"block": 1, "parameter": "w", "numel": 2, "dtype": "float32", "values": [1.0, 2.0, 3.0]},
         "base_weights.values must be a list of 1 to 2"),
        ({"block": 1, "parameter": None, "numel": 4, "dtype": "float32", "values": [1.0]},
         "base_weights.parameter must be a parameter name"),
    ])
    def test_malformed_base_weights_are_refused_as_inspect_and_loading_read_them(self, sample, words, tmp_path,
                                                                                 capsys):
        directory = make_bundle(tmp_path / "b")
        edit_bundle_manifest(directory, lambda m: m.__setitem__("base_weights", sample))
        assert words in one_line_inspect_error(capsys, directory)


# --------------------------------------------------------------------------------------------------- class 6
def one_computed_run(tmp_path: Path, metrics: dict | None = None):
    """A run of two cells computed by a test double; returns (config, the path of the GA cell's result.json)."""
    from cru_harness.runner import config as cfg
    from cru_harness.runner.cli import run_config

    config = cfg.load_config(write_run_config(tmp_path))

    def executor(cell, workdir):
        return {"metrics": dict(metrics or {"forget_rouge_l": 0.5, "forget_prob": 0.25})}

    assert run_config(config, executor=executor, report=False, log=lambda _: None) == 0
    ga = next(p for p in config.output_dir.glob("cells/*/result.json") if json.loads(p.read_text())["label"] == "GA")
    return config, ga


class TestResultContent:
    """Class 6: a result.json edited by hand (a metric +0.25, still valid JSON) was read by `report` and `run` as
    if computed. Cells carry a digest of their content, checked wherever a cell is read (run, report, compare and
    merge all read through `CellStore.load_result`); a metric outside its range is refused by name, digest or
    not. A cell without a digest (written before digests existed, as the committed results) is read as it is."""

    def test_a_result_carries_the_digest_of_its_content(self, tmp_path):
        from cru_harness.store import result_digest

        _, path = one_computed_run(tmp_path)
        result = json.loads(path.read_text())
        assert result["digest"].startswith("sha256:") and result["digest"] == result_digest(result)

    def test_an_edited_number_is_refused_and_recomputed(self, tmp_path):
        from cru_harness.store import CellStore, load_results
        from cru_harness.runner.cli import run_config

        config, path = one_computed_run(tmp_path)
        result = json.loads(path.read_text())
        result["metrics"]["forget_prob"] += 0.25   # still in range, still valid JSON
        path.write_text(json.dumps(result, indent=2))
        logged = []
        assert CellStore(config.output_dir, log=logged.append).load_result(result["hash"]) is None
        assert "its content does not match its digest" in logged[0] and str(path) in logged[0]
        assert result["hash"] not in {r["hash"] for r in load_results(config.output_dir, log=lambda _: None)}
        calls = []
        assert run_config(config, executor=fake_executor(calls), report=False, log=lambda _: None) == 0
        assert calls == [result["hash"]]   # run recomputed the edited cell alone

    def test_report_leaves_an_edited_cell_out_and_names_it(self, tmp_path, capsys):
        from cru_harness.cli import main

        config, path = one_computed_run(tmp_path)
        result = json.loads(path.read_text())
        result["metrics"]["forget_rouge_l"] = 0.75
        path.write_text(json.dumps(result))
        assert main(["report", str(config.output_dir)]) == 0
        err = capsys.readouterr().err
        assert f"{path} is not a valid cell file (its content does not match its digest" in err

    @pytest.mark.parametrize("name, value", [("forget_rouge_l", 1.25), ("forget_prob", -0.25),
                                             ("forget_quality", 1.5), ("mia_auc_loss", 2.0),
                                             ("mia_fm_loss", 0.5), ("utility_fluency", -1.0),
                                             ("retain_truth_ratio", 7.0), ("forget_fb", "high")])
    def test_a_metric_outside_its_range_is_refused_by_name_digest_or_not(self, name, value, tmp_path):
        from cru_harness.store import CellStore, validate_result, with_digest

        config, path = one_computed_run(tmp_path)
        result = json.loads(path.read_text())
        result["metrics"][name] = value
        legacy = {k: v for k, v in result.items() if k != "digest"}
        for content in (legacy, with_digest(result)):   # a legacy cell, and one whose digest was recomputed too
            path.write_text(json.dumps(content))
            problem = validate_result(json.loads(path.read_text()), result["hash"])
            assert problem is not None and problem.startswith(f"metric {name} ")
            assert CellStore(config.output_dir, log=lambda _: None).load_result(result["hash"]) is None

    def test_a_cell_computed_before_digests_is_read_as_it_is(self, tmp_path):
        from cru_harness.store import CellStore

        config, path = one_computed_run(tmp_path)
        result = json.loads(path.read_text())
        del result["digest"]
        path.write_text(json.dumps(result))
        record_path = path.parent / "run_record.json"
        record_path.write_text(json.dumps({**json.loads(record_path.read_text()),
                                           "finished": "2026-11-24T14:56:21+00:00"}))   # as the committed ones
        loaded = CellStore(config.output_dir, log=pytest.fail).load_result(result["hash"])
        assert loaded == result

    def test_a_relabelled_copy_gets_a_digest_of_its_own(self, tmp_path):
        from cru_harness.store import CellStore
        from cru_harness.runner.cli import copy_cell

        config, path = one_computed_run(tmp_path)
        result = json.loads(path.read_text())
        store = CellStore(config.output_dir)

        class Relabelled:   # what reuse_cells passes: the same computation under another label
            hash, label = "f" * 16, "GA-again"
            computation = __import__("cru_harness.runner.plan", fromlist=["computation_key"]).computation_key(
                json.loads((path.parent / "run_record.json").read_text())["resolved_config"])

            @staticmethod
            def resolved():
                return json.loads((path.parent / "run_record.json").read_text())["resolved_config"]

        out = CellStore(tmp_path / "out")
        assert copy_cell(store, out, result["hash"], keep_ok=True, as_cell=Relabelled)
        copied = out.load_result("f" * 16)
        assert copied is not None and copied["label"] == "GA-again"


# --------------------------------------------------------------------------------------------------- class 7
class TestOneLineRefusals:
    """Class 7: bad input that ended in a traceback. Each is one line naming the problem; a local model path that
    does not exist stops a run before any cell."""

    @pytest.mark.parametrize("value", [5, ["a", "b"], True, {"a": 1}, ""], ids=["int", "list", "bool", "mapping",
                                                                               "empty"])
    def test_a_wrongly_typed_output_dir_is_named(self, value, tmp_path, capsys):
        from cru_harness.cli import main

        path = write_run_config(tmp_path, output_dir=value)
        assert main(["run", str(path), "--dry-run"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"output_dir: expected a directory path, got {value!r}" in err[0]

    def test_a_config_that_is_not_utf8_is_named_with_the_byte(self, tmp_path, capsys):
        from cru_harness.cli import main

        path = tmp_path / "latin1.yaml"
        path.write_bytes("name: café\n".encode("latin-1"))
        assert main(["run", str(path), "--dry-run"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"cru-harness run: error: {path}: <file>: not UTF-8 text (byte 9: b'\\xe9'); save it as UTF-8"]

    def test_a_deeply_nested_config_is_one_line(self, tmp_path, capsys):
        from cru_harness.cli import main

        path = tmp_path / "deep.yaml"
        path.write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
        assert main(["run", str(path), "--dry-run"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "nested more than 50 levels deep" in err[0]

    def test_a_forget_file_that_is_not_utf8_is_named(self, tmp_path):
        from cru_harness.data.corpora import load_corpus_rows
        from cru_harness.data.sources import DataSourceError

        path = tmp_path / "forget.jsonl"
        path.write_bytes(b'{"text": "ok"}\n{"text": "\xff\xfe"}\n')
        with pytest.raises(DataSourceError, match=r"forget.jsonl is not UTF-8 text \(byte 25: b'\\xff'\)"):
            load_corpus_rows(str(path))

    def test_a_mistyped_manifest_field_is_one_line_in_inspect(self, tmp_path, capsys):
        directory = make_bundle(tmp_path / "b")
        edit_bundle_manifest(directory, lambda m: m.__setitem__("metrics", {"forget_gate_mean": [0.5]}))
        assert "metrics.forget_gate_mean must be a number" in one_line_inspect_error(capsys, directory)

    def test_a_full_disk_while_the_report_is_written_keeps_the_cells_and_is_one_line(self, tmp_path, capsys,
                                                                                       monkeypatch):
        import errno

        import cru_harness.reporting.cli as reporting
        from cru_harness.cli import main
        from cru_harness.runner import execute

        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "report" / "x.md"))

        monkeypatch.setattr(execute, "PlanExecutor", lambda store, cells, log=None: fake_executor([]))
        monkeypatch.setattr(reporting, "write_report", full)
        (tmp_path / "config.json").write_text("{}")
        assert main(["run", str(write_run_config(tmp_path))]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"cru-harness run: error: cannot write the report into "
                                                   f"{tmp_path / 'run' / 'report'}: No space left on device; the "
                                                   "cells are kept whole")
        assert len(list((tmp_path / "run" / "cells").glob("*/result.json"))) == 2
        # any command: a write error of the machine's is one line naming the file
        monkeypatch.setattr(reporting, "cmd_report", full)
        from cru_harness import cli

        assert cli.main(["report", str(tmp_path / "run")]) == 2
        assert "x.md: No space left on device" in capsys.readouterr().err

    def test_a_local_model_path_that_does_not_exist_stops_the_run_before_any_cell(self, tmp_path, capsys):
        from cru_harness.runner import config as cfg
        from cru_harness.runner.cli import run_config

        missing = tmp_path / "no" / "such" / "model"
        config = cfg.load_config(write_run_config(tmp_path, models=[{"name": "m", "path": str(missing)}]))
        calls = []
        with pytest.raises(cfg.ConfigError, match=rf"models\[0\]: model {missing} does not exist \(no such "
                                                   r"directory\)"):
            run_config(config, executor=fake_executor(calls), report=False, log=lambda _: None)
        assert calls == [] and not config.output_dir.exists()


# --------------------------------------------------------------------------------------------------- class 8
class TestAbsurdSizes:
    """Class 8: `effective_batch_size` 10**12, `num_epochs` 10**9, `d_r` 10**9 and `limit` 10**12 passed
    `--dry-run`. Each is bounded by more than any run can use (the bound and its reason live beside
    `HPARAM_BOUNDS`); the same table holds for the command lines' and the Python API's settings."""

    @pytest.mark.parametrize("extra, key, words", [
        ({"methods": [{"method": "GA", "effective_batch_size": 10 ** 12}]}, "methods[0].effective_batch_size",
         "must be <= 65536"),
        ({"methods": [{"method": "GA", "num_epochs": 10 ** 9}]}, "methods[0].num_epochs", "must be <= 1000"),
        ({"methods": [{"method": "CRU", "d_r": 10 ** 9}]}, "methods[0].d_r", "must be <= 65536"),
        ({"evaluation": {"limit": 10 ** 12}}, "evaluation.limit", "must be <= 1000000"),
        ({"benchmarks": {"tofu": {"splits": ["forget01"], "limit": 10 ** 12}}}, "benchmarks.tofu.limit",
         "must be <= 1000000"),
        ({"evaluation": {"batch_size": 10 ** 9}}, "evaluation.batch_size", "must be <= 65536"),
    ])
    def test_absurd_sizes_are_refused_by_a_dry_run(self, extra, key, words, tmp_path, capsys):
        from cru_harness.cli import main

        assert main(["run", str(write_run_config(tmp_path, **extra)), "--dry-run"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{key}: {words}" in err[0], err

    def test_the_same_bounds_hold_for_the_training_settings_of_the_python_api(self):
        from cru_harness.cru.train import RouterTrainingConfig
        from cru_harness.errors import InputError

        with pytest.raises(InputError, match="d_r: must be <= 65536"):
            RouterTrainingConfig(d_r=10 ** 9)
        with pytest.raises(InputError, match="epochs: must be <= 1000"):
            RouterTrainingConfig(epochs=10 ** 9)
        assert RouterTrainingConfig(d_r=64, epochs=1000).epochs == 1000   # the bounds themselves are taken

    def test_a_dry_run_names_each_trained_cells_settings(self, tmp_path, capsys):
        """Where no bound is meaningful (warmup_steps, max_length), the plan says what each cell would train with."""
        from cru_harness.cli import main

        path = write_run_config(tmp_path, methods=[{"method": "GA", "warmup_steps": 10 ** 6, "num_epochs": 1000}])
        assert main(["run", str(path), "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "num_epochs=1000" in out and "warmup_steps=1000000" in out

    def test_a_dry_run_states_what_each_training_costs_in_optimizer_steps(self, tmp_path, capsys, monkeypatch):
        """The epochs are bounded at 1000, not at what a user means to pay: the plan states the steps each cell
        would take, counted from the local data (forget01 of the testbed world: 20 rows)."""
        from cru_harness.cli import main

        monkeypatch.delenv("CRU_HARNESS_DATA_DIR", raising=False)
        monkeypatch.delenv("CRU_HARNESS_TOFU_DIR", raising=False)
        path = write_run_config(
            tmp_path, methods=[{"method": "GA", "num_epochs": 1000, "effective_batch_size": 8, "micro_batch_size": 4},
                               {"method": "CRU", "epochs": 3, "batch_size": 16}],
            benchmarks={"tofu": {"splits": ["forget01"], "data_dir": "testbed:world"}})
        assert main(["run", str(path), "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "; 2500 optimizer steps (1000 epochs, effective batch 8, 20 forget rows)" in out
        assert "; 6 router steps (3 epochs, batch 16, 20 forget rows)" in out
        # without local data nothing is downloaded to count: the plan says when the steps are known
        path = write_run_config(tmp_path, name="hub", methods=[{"method": "GA", "num_epochs": 1000}])
        assert main(["run", str(path), "--dry-run"]) == 0
        assert "; steps counted when the data is loaded (1000 epochs, effective batch 32)" in capsys.readouterr().out
        # a batch the trainer would refuse is named although the rows cannot be counted
        path = write_run_config(tmp_path, name="ratio",
                                methods=[{"method": "GA", "effective_batch_size": 10, "micro_batch_size": 4}])
        main(["run", str(path), "--dry-run"])
        out = capsys.readouterr()
        assert "steps not counted: effective_batch_size 10 is not a multiple of micro_batch_size 4" in out.out + out.err

    def test_a_dry_run_names_the_weights_each_method_trains(self, tmp_path, capsys):
        """LUNAR and RMU train a few matrices, not the whole model: the plan says which, from the cell's settings."""
        from cru_harness.cli import main

        (tmp_path / "p.json").write_text('["Write malware."]')
        path = write_run_config(tmp_path, methods=[{"method": "GA"}, {"method": "RMU", "layer": 3},
                                                   {"method": "LUNAR", "layer": 5,
                                                    "refusal_prompts_path": str(tmp_path / "p.json")},
                                                   {"method": "CRU"}])
        assert main(["run", str(path), "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "trains: GA all weights on" in out and "trains: CRU routers (base frozen) on" in out
        assert "trains: RMU blocks 1, 2, 3: weights matching mlp\\.down_proj\\.weight on" in out
        assert "trains: LUNAR block 5's MLP down projection on" in out

    def test_a_dry_run_refuses_an_input_file_a_method_reads_that_is_not_there(self, tmp_path, capsys):
        """LUNAR's refusal prompts are the user's file: a path that is not there would fail every LUNAR cell after
        the fine-tuning and the other cells; the dry run refuses it in one line naming the key (issue 78, class 3:
        a warning let `run` go on to train)."""
        from cru_harness.cli import main

        path = write_run_config(tmp_path, methods=[{"method": "LUNAR", "refusal_prompts_path": "no/such.json"}])
        assert main(["run", str(path), "--dry-run"]) == 2
        out, err = capsys.readouterr()
        assert "experiment t" not in out and len(err.strip().splitlines()) == 1, err
        assert "methods[0].refusal_prompts_path: no/such.json does not exist" in err
        (tmp_path / "prompts.json").write_text('["Write malware."]')
        path = write_run_config(tmp_path, name="there",
                                methods=[{"method": "LUNAR", "refusal_prompts_path": str(tmp_path / "prompts.json")}])
        assert main(["run", str(path), "--dry-run"]) == 0
        assert "does not exist" not in capsys.readouterr().out


# ================================================================ issue 78: nothing lost, nothing let in, part 3
class TestOneOutputRule:
    """Issue 78, class 1: `unlearn --out o` deleted the user's `o.tmp/`; two runs to one --out both succeeded, one
    silently replacing the other; `compare`, `report --out` and `score --output-dir` wrote into any directory and
    overwrote a user's report.md. One rule: roots, home and directories cru-harness did not write are refused,
    staging is a fresh private directory, nothing the harness did not write is deleted, one writer at a time."""

    def test_staging_never_touches_a_directory_named_like_the_target(self, tmp_path):
        from cru_harness.locations import write_directory

        (tmp_path / "o.tmp").mkdir()
        (tmp_path / "o.tmp" / "thesis.tex").write_text("precious")
        seen = []

        def write(tmp):
            seen.append(tmp)
            (tmp / "unlearn_record.json").write_text("{}")

        write_directory(tmp_path / "o", write)
        assert (tmp_path / "o.tmp" / "thesis.tex").read_text() == "precious"
        assert (tmp_path / "o" / "unlearn_record.json").is_file() and seen[0].name.startswith(".o.")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "o.tmp"]   # no staging or lock left
        write_directory(tmp_path / "o", write)   # replacing its own output is fine

        def fail(tmp):
            (tmp / "half").write_text("x")
            raise RuntimeError("killed")

        with pytest.raises(RuntimeError):
            write_directory(tmp_path / "o", fail)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "o.tmp"]
        assert (tmp_path / "o" / "unlearn_record.json").is_file()

    def test_a_directory_the_harness_did_not_write_is_never_replaced(self, tmp_path):
        from cru_harness.locations import OutputLocationError, check_output_dir, write_directory

        theirs = tmp_path / "theirs"
        theirs.mkdir()
        (theirs / "thesis.tex").write_text("precious")
        with pytest.raises(OutputLocationError, match="holds files cru-harness did not write \\(thesis.tex\\)"):
            check_output_dir(theirs, what="--out", overwrite=True)
        with pytest.raises(OutputLocationError, match="the result is kept in"):
            write_directory(theirs, lambda tmp: (tmp / "config.json").write_text("{}"), overwrite=True)
        assert [p.name for p in theirs.iterdir()] == ["thesis.tex"]
        kept = [p for p in tmp_path.iterdir() if p.name.startswith(".theirs.")]
        assert len(kept) == 1 and (kept[0] / "config.json").is_file()   # the trained result is not lost either

    def test_a_second_writer_of_one_out_is_refused_naming_the_first(self, tmp_path, capsys):
        import subprocess
        import sys
        import time

        from cru_harness.cli import main
        from cru_harness.locations import lock_path

        out = tmp_path / "o"
        holder = subprocess.Popen([sys.executable, "-c", (
            "import sys, time; from cru_harness.locations import output_lock\n"
            f"with output_lock({str(out)!r}):\n    print('held', flush=True); time.sleep(60)")],
            stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            (tmp_path / "m").mkdir()
            (tmp_path / "m" / "config.json").write_text("{}")
            rc = main(["attack", "--attack", "detach", "--model", str(tmp_path / "m"), "--out", str(out)])
            err = capsys.readouterr().err.strip().splitlines()
            assert rc == 2 and len(err) == 1, err
            assert f"--out {str(out)!r} is being written by process {holder.pid} on host" in err[0]
        finally:
            holder.kill()
            holder.wait()
        assert not out.exists()
        start = time.monotonic()
        from cru_harness.locations import output_lock

        with output_lock(out):   # the dead holder's lock is free at once
            assert lock_path(out).is_file()
        assert time.monotonic() - start < 5 and not lock_path(out).exists()

    @pytest.mark.parametrize("where", ["~", "theirs"])
    def test_report_out_into_a_foreign_directory_is_refused(self, where, tmp_path, monkeypatch, capsys):
        from cru_harness.cli import main
        from cru_harness.locations import OutputLocationError, check_files_dir

        with pytest.raises(OutputLocationError, match="is the file system root"):
            check_files_dir("/", what="--out")
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        (tmp_path / "home").mkdir()
        config, _ = one_computed_run(tmp_path)
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        (theirs / "report.md").write_text("my report")
        out = str(theirs) if where == "theirs" else where
        assert main(["report", str(config.output_dir), "--out", out, "--no-plots"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("cru-harness report: error: --out "), err
        assert (theirs / "report.md").read_text() == "my report"
        assert not (tmp_path / "home" / "report.md").exists()

    def test_report_out_creates_marks_and_rewrites_its_own_directory(self, tmp_path, capsys):
        from cru_harness.cli import main

        config, _ = one_computed_run(tmp_path)
        out = tmp_path / "mine"
        for _ in range(2):   # the second time into the directory it wrote itself
            assert main(["report", str(config.output_dir), "--out", str(out), "--no-plots"]) == 0
        assert (out / "report.md").is_file() and (out / ".cru-harness-output").is_file()
        assert main(["report", str(config.output_dir), "--no-plots"]) == 0   # the run's own report/: unmarked
        assert not (config.output_dir / "report" / ".cru-harness-output").exists()
        assert not [p for p in config.output_dir.iterdir() if p.name.endswith(".lock")]

    def test_score_output_dir_is_refused_among_foreign_files(self, tmp_path, capsys):
        from cru_harness.cli import main

        theirs = tmp_path / "theirs"
        theirs.mkdir()
        (theirs / "scores.json").write_text("mine")
        assert main(["score", str(tmp_path / "lmeval"), "--output-dir", str(theirs)]) == 2
        assert "--output-dir" in capsys.readouterr().err and (theirs / "scores.json").read_text() == "mine"

    def test_compare_writes_only_into_a_run_or_its_out(self, tmp_path, capsys):
        from cru_harness.cli import main

        config, _ = one_computed_run(tmp_path)
        etc = tmp_path / "etc"
        etc.mkdir()
        (etc / "passwd").write_text("root")
        assert main(["compare", str(etc), str(config.output_dir)]) == 2
        assert "holds no cells/ directory" in capsys.readouterr().err
        assert [p.name for p in etc.iterdir()] == ["passwd"]
        assert main(["compare", str(config.output_dir), str(config.output_dir), "--out", str(etc)]) == 2
        assert "was not written by cru-harness" in capsys.readouterr().err
        assert main(["compare", str(config.output_dir), str(config.output_dir), "--out",
                     str(tmp_path / "cmp")]) == 0
        assert (tmp_path / "cmp" / "reproduction.md").is_file()


class TestResultsSurviveResume:
    """Issue 78, class 2: a cell of a newer schema was recomputed over; a failed `--force` recompute replaced a good
    result with a failed one; a symlinked cell directory was written through; removing `digest` made an edited
    metric read as it is."""

    def test_a_cell_of_a_newer_cru_harness_stops_the_run_and_is_kept(self, tmp_path, capsys):
        from cru_harness.cli import main

        config, path = one_computed_run(tmp_path)
        future = {**json.loads(path.read_text()), "schema_version": 2, "new_field": [1]}
        path.write_text(json.dumps(future))
        before = path.read_bytes()
        assert main(["run", str(tmp_path / "t.yaml"), "--no-report", "--force"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "was written by a newer cru-harness (schema_version 2; this one reads 1)" in err[0]
        assert path.read_bytes() == before

    def test_a_failed_recompute_keeps_the_good_result(self, tmp_path, capsys):
        from cru_harness.store import CellStore
        from cru_harness.runner.cli import run_config
        from cru_harness.runner import config as cfg

        config, path = one_computed_run(tmp_path)
        good = json.loads(path.read_text())

        def broken(cell, workdir):
            raise RuntimeError("out of memory")

        logged = []
        run_config(cfg.load_config(tmp_path / "t.yaml"), executor=broken, report=False, force=True,
                   log=logged.append)
        assert json.loads(path.read_text()) == good
        assert CellStore(config.output_dir).load_result(good["hash"])["status"] == "ok"
        assert not list(config.output_dir.glob("cells/*/previous.*"))
        assert any("ended failed (RuntimeError: out of memory); its earlier ok result is kept" in line
                   for line in logged), logged
        # a good recompute replaces it
        assert run_config(cfg.load_config(tmp_path / "t.yaml"), executor=fake_executor([]), report=False,
                          force=True, log=lambda _: None) == 0
        assert not list(config.output_dir.glob("cells/*/previous.*"))

    def test_a_linked_cell_is_neither_written_through_nor_followed(self, tmp_path, capsys):
        import shutil

        from cru_harness.cli import main

        config, path = one_computed_run(tmp_path)
        outside = tmp_path / "outside"
        shutil.move(str(path.parent), outside)
        path.parent.symlink_to(outside, target_is_directory=True)
        before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
        assert main(["report", str(config.output_dir), "--no-plots"]) == 0
        assert "is a symbolic link" in capsys.readouterr().err
        assert main(["run", str(tmp_path / "t.yaml"), "--no-report", "--force"]) == 2
        err = capsys.readouterr().err
        assert "is a symbolic link: a run's cells are its own files" in err
        assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before

    def test_a_removed_digest_on_a_cell_that_had_one_is_tampering(self, tmp_path):
        from cru_harness.store import CellStore

        config, path = one_computed_run(tmp_path)
        result = json.loads(path.read_text())
        del result["digest"]
        result["metrics"]["forget_rouge_l"] = 0.01
        path.write_text(json.dumps(result))
        logged = []
        assert CellStore(config.output_dir, log=logged.append).load_result(result["hash"]) is None
        assert "it has no digest, but its record" in logged[0] and "its digest was removed" in logged[0]


class TestConfigsSayOneThing:
    """Issue 78, class 6: a mapping with a key given twice was read with the last value (`trust_remote_code:
    false` then `true` enabled remote code). Wherever the project reads YAML (runner and study configs, --set
    values of `unlearn` and `attack`), it is an error naming the key and both lines."""

    def test_a_duplicated_key_in_a_run_config_is_named_with_both_lines(self, tmp_path, capsys):
        from cru_harness.cli import main

        path = tmp_path / "dup.yaml"
        path.write_text("name: t\nmodels:\n  - name: m\n    path: zoo:llama\n    trust_remote_code: false\n"
                        "    trust_remote_code: true\nbenchmarks: {tofu: {}}\nmethods: [GA]\n")
        assert main(["run", str(path), "--dry-run"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "key 'trust_remote_code' is given twice in one mapping (lines 5 and 6)" in err[0]

    def test_a_study_config_and_merge_keys(self, tmp_path):
        from cru_harness.runner.config import ConfigError
        from cru_harness.studies.config import load_study
        from cru_harness.yamlfile import read_yaml

        path = tmp_path / "study.yaml"
        path.write_text("study: {kind: overlap}\nname: a\nname: b\n")
        with pytest.raises(ConfigError, match=r"key 'name' is given twice in one mapping \(lines 2 and 3\)"):
            load_study(path)
        path.write_text("base: &b {lr: 1, seed: 0}\nx:\n  <<: *b\n  lr: 2\n")   # an override beside a merge
        assert read_yaml(path)["x"] == {"lr": 2, "seed": 0}

    @pytest.mark.parametrize("argv", [
        ["unlearn", "--method", "GA", "--set", "lr={a: 1, a: 2}"],
        ["unlearn", "--method", "GA", "--set", "lr=1e-5", "--set", "lr=2e-5"],
        ["attack", "--attack", "quantize", "--set", "weights=int8", "--set", "weights=int4"],
        ["attack", "--attack", "quantize", "--set", "weights=[unclosed"],
    ])
    def test_set_values_say_one_thing(self, argv, tmp_path, capsys):
        from cru_harness.cli import main

        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text("{}")
        common = (["--base", str(tmp_path / "m"), "--forget", "forget01", "--retain", "retain99"]
                  if argv[0] == "unlearn" else ["--model", str(tmp_path / "m")])
        assert main([*argv, *common, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ("given twice" in err[0] or "is not a YAML value" in err[0]), err
        assert not (tmp_path / "o").exists()


class FakeEntryPoint:
    """An installed plugin's entry point (importlib.metadata's), whose import does what `load` says."""

    def __init__(self, name, load, dist="acme-unlearn"):
        self.name, self.value, self._load = name, f"acme.{name.lower()}:METHOD", load
        self.dist = type("Dist", (), {"name": dist, "version": "0.1"})()

    def load(self):
        return self._load()


@pytest.fixture
def installed(monkeypatch):
    """Install fake entry points beside the real ones: `installed(group, *eps)`; the registries re-read."""
    from importlib.metadata import entry_points as real

    from cru_harness import plugins

    extra: dict[str, list] = {}

    def fake(group):
        return [*real(group=group), *extra.get(group, [])]

    monkeypatch.setattr(plugins, "entry_points", fake)
    for registry in (plugins.methods, plugins.benchmarks, plugins.attacks):
        monkeypatch.setattr(registry, "_items", None)

    def install(group, *eps):
        extra.setdefault(group, []).extend(eps)
        for registry in (plugins.methods, plugins.benchmarks, plugins.attacks):
            registry._items = None
    return install


class TestPlugins:
    """Issue 78, class 5: a plugin whose import raised anything but ImportError was a traceback, and a broken one
    stopped every command; "GA " sat beside GA; a run() returning something else failed far away."""

    @pytest.mark.parametrize("error", [RuntimeError("no GPU here"), SyntaxError("invalid syntax"),
                                       KeyError("HOME"), ImportError("no module acme")])
    def test_a_broken_plugin_blocks_only_its_own_name(self, error, installed, tmp_path, capsys):
        from cru_harness import plugins
        from cru_harness.cli import main

        def boom():
            raise error

        installed("cru_harness.methods", FakeEntryPoint("Broken", boom))
        installed("cru_harness.benchmarks", FakeEntryPoint("Shaky", boom, dist="shaky-bench"))
        with pytest.raises(plugins.PluginError) as info:
            plugins.methods.get("broken ")
        message = str(info.value)
        assert "method plugin 'Broken'" in message and "acme-unlearn 0.1" in message
        assert type(error).__name__ in message and "\n" not in message
        assert plugins.methods.get("GA").name == "GA" and "tofu" in plugins.benchmarks.names()
        assert main(["methods"]) == 0   # the listing names it and lists the rest
        listing = capsys.readouterr()
        assert "GA" in listing.out and "not usable: method plugin 'Broken'" in listing.err
        config, _ = one_computed_run(tmp_path)   # a run of built-in methods
        assert main(["report", str(config.output_dir), "--no-plots"]) == 0   # report on existing results
        path = write_run_config(tmp_path, name="b", methods=[{"method": "Broken"}])
        assert main(["run", str(path), "--dry-run"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "acme-unlearn" in err[0], err

    def test_names_are_compared_without_case_or_whitespace(self, installed):
        from cru_harness import api, plugins

        assert plugins.methods.get(" ga\t").name == "GA" and "G A".replace(" ", "") in plugins.methods
        with pytest.raises(plugins.PluginError, match="already registered"):
            plugins.methods.register(type("Spaced", (api.Method,), {"name": "GA "})())
        twin = type("Twin", (api.Method,), {"name": "npo "})()
        installed("cru_harness.methods", FakeEntryPoint("npo ", lambda: twin, dist="twin-pkg"))
        with pytest.raises(plugins.PluginError, match="two methods are named 'npo ': .*twin-pkg"):
            plugins.methods.get("NPO")
        assert plugins.methods.get("GA").name == "GA"   # the rest are unaffected

    @pytest.mark.parametrize("value, words", [("out/model", "returned 'out/model' \\(str\\)"),
                                              (None, "returned None \\(NoneType\\)"),
                                              ("trained-bad-path", "returned Trained\\(model_path=5\\)"),
                                              ("trained-bad-routers", "returned Trained\\(routers=\\[.a.\\]\\)")])
    def test_a_run_that_breaks_its_contract_is_named(self, value, words):
        from cru_harness import api, plugins

        value = {"trained-bad-path": api.Trained(model_path=5),
                 "trained-bad-routers": api.Trained(model_path="m", routers=["a"])}.get(value, value)
        method = type("Sloppy", (api.Method,), {"name": "Sloppy"})()
        with pytest.raises(plugins.PluginError, match=rf"method plugin 'Sloppy' .* breaks the run\(\) contract: it "
                                                      rf"{words}; run\(ctx\) must return cru_harness.api.Trained"):
            plugins.check_trained(value, method, "method")
        good = api.Trained(model_path="m")
        assert plugins.check_trained(good, method, "method") is good


class TestOneLineNotATraceback:
    """Issue 78, class 4: bad input that ended in a traceback; each is one line naming it, before any model loads."""

    @pytest.mark.parametrize("content, words", [(None, "is a directory"), ('{"a": 1}', "got a dict"),
                                                ("5", "got a int"), ("[1, 2]", "must be a string"),
                                                (b"\xff\xfe", "not a JSON list")])
    def test_lunar_refusal_prompts_that_are_not_a_list_of_strings(self, content, words, tmp_path):
        from cru_harness.baselines.lunar import read_prompts
        from cru_harness.errors import UserError

        path = tmp_path / "prompts.json"
        if content is None:
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        with pytest.raises(UserError, match=words):
            read_prompts(str(path))

    def test_scalars_where_lists_are_expected(self, tmp_path, capsys):
        from cru_harness.attacks.quantize import QuantizeConfig
        from cru_harness.baselines.rmu import RMUConfig
        from cru_harness.cli import main
        from cru_harness.errors import InputError

        with pytest.raises(InputError, match="trainable_params: expected a list of parameter name patterns, got 5"):
            RMUConfig(trainable_params=5)
        with pytest.raises(InputError, match="trainable_layers: expected a list of block indices, got 3"):
            RMUConfig(trainable_layers=3)
        with pytest.raises(InputError, match="exclude: expected a list of module-name patterns, got 5"):
            QuantizeConfig(exclude=5)
        assert QuantizeConfig(exclude="lm_head").exclude == ("lm_head",)
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text("{}")
        assert main(["attack", "--attack", "quantize", "--set", "exclude=5", "--model", str(tmp_path / "m"),
                     "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "exclude: expected a list" in err[0]

    def test_a_checkpoint_needing_its_own_code_is_refused_unless_trusted(self, tmp_path, monkeypatch):
        from transformers import AutoModelForCausalLM

        from cru_harness.devices import load_causal_lm
        from cru_harness.locations import ModelPathError, check_remote_code

        model = tmp_path / "custom"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({"model_type": "acme-net",
                                                       "auto_map": {"AutoModelForCausalLM": "modeling_acme.Acme"}}))
        monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                            lambda *a, **k: pytest.fail("tried to load a model needing its own code"))
        with pytest.raises(ModelPathError, match="needs its own Python code to load .* trust_remote_code is off"):
            load_causal_lm(str(model), device="cpu")
        check_remote_code(model, True)   # asked for: left to transformers
        (model / "config.json").write_text(json.dumps({"model_type": "llama", "auto_map": {"x": "y"}}))
        check_remote_code(model, False)   # an architecture transformers has: no code of the checkpoint runs

    def test_lens_checks_its_json_and_testbed_names_before_loading(self, tmp_path, capsys, monkeypatch):
        import cru_harness.devices as devices
        from cru_harness.cli import main

        monkeypatch.setattr(devices, "load_causal_lm", lambda *a, **k: pytest.fail("loaded a model"))
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text("{}")
        for json_path, words in [(tmp_path / "no" / "such" / "x.json", "does not exist"),
                                 (tmp_path, "is a directory")]:
            assert main(["lens", "--model", str(tmp_path / "m"), "--data", "forget01", "--json",
                         str(json_path)]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and words in err[0], err
        assert main(["lens", "--model", "zoo:nosuch", "--data", "forget01"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "unknown tiny architecture 'nosuch'" in err[0], err

    def test_a_run_refuses_a_methods_missing_input_file_before_any_cell(self, tmp_path):
        from cru_harness.runner import config as cfg
        from cru_harness.runner.cli import run_config

        config = cfg.load_config(write_run_config(tmp_path, methods=[
            {"method": "GA"}, {"method": "LUNAR", "refusal_prompts_path": str(tmp_path / "no.json")}]))
        calls = []
        with pytest.raises(cfg.ConfigError, match=r"methods\[1\]\.refusal_prompts_path: .*no.json does not exist"):
            run_config(config, executor=fake_executor(calls), report=False, log=lambda _: None)
        assert calls == []


class TestMessagesAndLeftovers:
    """Issue 78, class 7: a 200,000-character name reached an error line whole; refused input left an empty --out;
    a full disk left a 0-byte config.json; compare on a read-only run lost its verdict; every cell printed `fatal:
    not a git repository` outside a checkout."""

    def test_a_huge_name_is_bounded_in_every_error_line(self, tmp_path, capsys):
        from cru_harness.cli import main
        from cru_harness.errors import MAX_ERROR_LINE
        from cru_harness.runner import config as cfg
        from cru_harness.runner.cli import run_config

        mine = cfg.load_config(write_run_config(tmp_path, name="mine"))
        assert run_config(mine, executor=fake_executor([]), report=False, log=lambda _: None) == 0
        huge = "n" * 200_000
        plan = json.loads((mine.output_dir / "plan.json").read_text())
        plan["config"]["name"] = huge
        (mine.output_dir / "plan.json").write_text(json.dumps(plan))
        assert main(["run", str(write_run_config(tmp_path, name="mine")), "--dry-run"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "holds the run of another experiment" in err[0] and len(err[0]) < 1000
        from cru_harness.errors import InputError, report_user_error   # any user error, whatever it echoes

        report_user_error("cru-harness x", InputError("y" * 300_000))
        line = capsys.readouterr().err
        assert len(line) < MAX_ERROR_LINE + 100 and "more characters left out" in line

    def test_refused_input_leaves_no_empty_out(self, tmp_path, capsys):
        from cru_harness.cli import main

        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text("{}")
        out = tmp_path / "o"
        assert main(["attack", "--attack", "relearn", "--model", str(tmp_path / "m"), "--out", str(out),
                     "--forget-corpus", str(tmp_path / "no-such.json")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "no-such.json" in err[0], err
        assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m"]

    def test_a_full_disk_while_saving_leaves_no_empty_checkpoint(self, tmp_path):
        import errno

        from cru_harness.locations import write_directory

        def full(tmp):
            (tmp / "config.json").write_text("")
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "model.safetensors"))

        with pytest.raises(OSError, match="No space left"):
            write_directory(tmp_path / "o", full)
        assert list(tmp_path.iterdir()) == []   # no 0-byte config.json, no staging directory

    def test_compare_on_a_read_only_run_still_gives_its_verdict(self, tmp_path, capsys, monkeypatch):
        from cru_harness.cli import main
        from cru_harness.errors import OutputWriteError
        from cru_harness.runner import reproduce

        config, _ = one_computed_run(tmp_path)
        real = reproduce.atomic_write_text

        def read_only(path, text):   # what atomic_write_text raises on a read-only file system
            if Path(path).parent == config.output_dir:
                raise OutputWriteError(f"cannot write {path}: Read-only file system")
            return real(path, text)

        monkeypatch.setattr(reproduce, "atomic_write_text", read_only)
        assert main(["compare", str(config.output_dir), str(config.output_dir)]) == 0
        out = capsys.readouterr().out
        assert "details not written" in out and "give --out DIR" in out and "reproduc" in out.lower()
        assert main(["compare", str(config.output_dir), str(config.output_dir), "--out", str(tmp_path / "c")]) == 0
        assert (tmp_path / "c" / "reproduction.md").is_file()

    def test_no_git_noise_per_cell_outside_a_checkout(self, tmp_path, monkeypatch, capfd):
        from lm_eval import evaluator

        from cru_harness.fingerprints import quiet_lm_eval_git

        monkeypatch.chdir(tmp_path)
        with quiet_lm_eval_git():
            assert evaluator.get_git_commit_hash() is None
        assert "fatal" not in capfd.readouterr().err
        evaluator.get_git_commit_hash()   # lm-eval's own: the noise this removes
        assert "not a git repository" in capfd.readouterr().err


class TestCheckedUpFront:
    """Issue 78, class 3: what an argument names is checked before any work: a missing or corrupt bundle given to
    an attack, a forget corpus that is not there or a slice larger than it, an empty path, a name longer than the
    file system takes."""

    @pytest.fixture
    def attack_args(self, tmp_path, monkeypatch):
        import cru_harness.devices as devices

        monkeypatch.setattr(devices, "load_causal_lm", lambda *a, **k: pytest.fail("loaded a model"))
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text("{}")
        rows = tmp_path / "forget.json"
        rows.write_text(json.dumps([{"question": f"q{i}", "answer": f"a{i}"} for i in range(4)]))
        return ["attack", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "o")]

    @pytest.mark.parametrize("extra, words", [
        (["--attack", "detach", "--routers", "{tmp}/no-bundle"], "no-bundle"),
        (["--attack", "detach", "--routers", "{tmp}/m"], "cru_bundle.json"),
        (["--attack", "relearn", "--forget-corpus", "{tmp}/nothing.json"], "nothing.json"),
        (["--attack", "relearn", "--forget-corpus", "{tmp}/forget.json", "--set", "slice_size=10"],
         "slice_size 10"),
    ], ids=["missing-bundle", "not-a-bundle", "missing-corpus", "slice-too-large"])
    def test_an_attack_checks_what_it_reads_before_loading(self, extra, words, attack_args, tmp_path, capsys):
        from cru_harness.cli import main

        assert main([*attack_args, *[e.replace("{tmp}", str(tmp_path)) for e in extra]]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
        assert not (tmp_path / "o").exists()

    @pytest.mark.parametrize("out, words", [("", "is empty"), ("x" * 300, "more than a file system takes")])
    def test_empty_and_overlong_outputs_are_refused(self, out, words, tmp_path, capsys, monkeypatch):
        from cru_harness.cli import main
        from cru_harness.locations import OutputLocationError, check_files_dir, check_output_dir

        monkeypatch.chdir(tmp_path)
        for check in (check_output_dir, check_files_dir):
            with pytest.raises(OutputLocationError, match=words):
                check(out, what="--out")
        config, _ = one_computed_run(tmp_path)
        assert main(["report", str(config.output_dir), "--out", out, "--no-plots"]) == 2
        assert words in capsys.readouterr().err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "t.yaml"]


class TestRunAttackInputs:
    """Issue 78, class 3: a run's attacks read corpora and draw slices; `run --dry-run` (and `run`, before any
    cell) refuses in one line naming the key: a relearn corpus that is not there, does not parse or is another
    benchmark's; a slice larger than the forget split; a prompt attack on tasks that have no variant (dropped
    silently before: no cell, no word)."""

    @pytest.mark.parametrize("attack, key, words", [
        ({"attack": "relearn", "corpus": "{tmp}/nothing.json"}, "attacks[0].corpus", "nothing.json"),
        ({"attack": "relearn", "corpus": "{tmp}/bad.json"}, "attacks[0].corpus", "bad.json"),
        ({"attack": "relearn", "corpus": "rwku:1:passage"}, "attacks[0].corpus", "is not a tofu corpus"),
        ({"attack": "relearn", "corpus": "retain90[:4] + nope"}, "attacks[0].corpus", "'nope' is not a tofu corpus"),
        ({"attack": "relearn", "slice_size": 1000}, "attacks[0].slice_size", "slice_size 1000"),
        ({"attack": "in_context", "slice_size": 1000}, "attacks[0].slice_size", "slice_size 1000"),
    ], ids=["missing-corpus", "corpus-not-json", "other-benchmark", "unknown-part", "relearn-slice",
            "in-context-slice"])
    def test_a_dry_run_refuses_what_an_attack_would_fail_on(self, attack, key, words, tmp_path, capsys):
        from cru_harness.cli import main

        (tmp_path / "bad.json").write_text("[{not json")
        attack = {k: v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v for k, v in attack.items()}
        path = write_run_config(tmp_path, benchmarks={"tofu": {"splits": ["forget01"], "data_dir": "testbed:world"}},
                                attacks=[attack])
        assert main(["run", str(path), "--dry-run"]) == 2
        out, err = capsys.readouterr()
        assert "experiment t" not in out
        lines = err.strip().splitlines()
        assert len(lines) == 1 and f"{key}: " in lines[0] and words in lines[0], lines

    def test_the_same_attacks_on_good_inputs_plan(self, tmp_path, capsys):
        from cru_harness.cli import main

        (tmp_path / "benign.json").write_text(json.dumps([{"question": "q", "answer": "a"}]))
        path = write_run_config(tmp_path, benchmarks={"tofu": {"splits": ["forget01"], "data_dir": "testbed:world"}},
                                attacks=[{"attack": "relearn", "corpus": str(tmp_path / "benign.json")},
                                         {"attack": "relearn", "label": "benign2", "corpus": "retain90[:4]"},
                                         {"attack": "relearn", "label": "r2", "slice_size": 2}, "in_context"])
        assert main(["run", str(path), "--dry-run"]) == 0, capsys.readouterr().err
        assert "experiment t" in capsys.readouterr().out

    def test_a_prompt_attack_on_tasks_without_a_variant_is_refused(self, tmp_path, capsys):
        from cru_harness.cli import main

        path = write_run_config(tmp_path, benchmarks={"rwku": {"targets": [1]}}, attacks=["paraphrase"])
        assert main(["run", str(path), "--dry-run"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "attacks[0]: paraphrase varies the prompts" in err[0] and "rwku" in err[0], err
        # beside a benchmark whose tasks have it, RWKU's cells get none (its AA probe is its paraphrase), and the
        # run says so in one line instead of dropping them silently
        path = write_run_config(tmp_path, name="both", attacks=["paraphrase"], benchmarks={
            "rwku": {"targets": [1]}, "tofu": {"splits": ["forget01"], "data_dir": "testbed:world"}})
        assert main(["run", str(path), "--dry-run"]) == 0, capsys.readouterr().err
        said = "".join(capsys.readouterr())
        assert "note: attacks[0] (paraphrase) makes no cell on rwku: none of its tasks has a paraphrase variant" \
            in said and "makes no cell on tofu" not in said, said

    def test_a_run_refuses_before_any_cell(self, tmp_path):
        from cru_harness.runner import config as cfg
        from cru_harness.runner.cli import run_config

        config = cfg.load_config(write_run_config(
            tmp_path, benchmarks={"tofu": {"splits": ["forget01"], "data_dir": "testbed:world"}},
            attacks=[{"attack": "relearn", "corpus": str(tmp_path / "gone.jsonl")}]))
        calls = []
        with pytest.raises(cfg.ConfigError, match=r"attacks\[0\]\.corpus: .*gone.jsonl"):
            run_config(config, executor=fake_executor(calls), report=False, log=lambda _: None)
        assert calls == []


def _word_tokenizer(directory: Path, words: list[str], vocab_size: int | None = None) -> Path:
    """A tiny word-level tokenizer (and a config.json) saved in `directory`: what a model directory's tokenizer
    files look like, without weights."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<eos>", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>").save_pretrained(directory)
    (directory / "config.json").write_text(json.dumps({"vocab_size": vocab_size or len(vocab)}))
    return directory


class TestPrivacyReferenceModel:
    """Issue 78, class 3: the `cru` model's `reference=` model (the privacy metrics' reference attack; the runner
    passes the retain cell's checkpoint, `score`/lm-eval users name one) is checked before the base loads: a
    missing path, or a tokenizer that gives other ids than the evaluated model's, is one line."""

    def test_a_missing_reference_is_refused_before_loading(self, fake_model_dir, hflm_calls, tmp_path):
        from cru_harness.errors import UserError
        from cru_harness.lmeval.model import CRULM

        with pytest.raises(UserError, match=r"reference model \(reference=\) .*nothing.* does not exist"):
            CRULM(base=str(fake_model_dir), reference=str(tmp_path / "nothing"), device="cpu")
        assert hflm_calls == []

    def test_a_reference_with_another_tokenizer_is_refused_before_loading(self, hflm_calls, tmp_path):
        from cru_harness.lmeval.model import CRULM, ModelArgumentError

        base = _word_tokenizer(tmp_path / "base", ["the", "quick", "brown", "fox"])
        other = _word_tokenizer(tmp_path / "other", ["fox", "brown", "quick", "the"])   # same words, other ids
        with pytest.raises(ModelArgumentError, match="has another tokenizer than the evaluated model"):
            CRULM(base=str(base), reference=str(other), device="cpu")
        # a checkpoint saved without its tokenizer: its vocabulary size is what can be compared
        bare = tmp_path / "bare"
        bare.mkdir()
        (bare / "config.json").write_text(json.dumps({"vocab_size": 50}))
        with pytest.raises(ModelArgumentError, match="has vocab_size 50, the evaluated model 6"):
            CRULM(base=str(base), reference=str(bare), device="cpu")
        assert hflm_calls == []
        # the same tokenizer (the retain checkpoint of the same model) passes on to loading the base
        same = _word_tokenizer(tmp_path / "same", ["the", "quick", "brown", "fox"])
        with pytest.raises(StopBeforeLoading):
            CRULM(base=str(base), reference=str(same), device="cpu")
        assert len(hflm_calls) == 1


class TestWHPDirectories:
    """Issue 78, classes 3 and 4: a WHP directory's links were followed out of it, and an offline Hub id as its
    starting model ended in two tracebacks at evaluation; both are one line when the directory is read."""

    def whp_dir(self, tmp_path: Path, baseline: str) -> Path:
        root = tmp_path / "whp"
        (root / "reinforced").mkdir(parents=True)
        (root / "reinforced" / "config.json").write_text("{}")
        (root / "whp.json").write_text(json.dumps({"format_version": 1, "baseline": baseline, "alpha": 1.0,
                                                   "reinforced": "reinforced"}))
        return root

    def test_links_and_unreachable_starting_models_are_refused(self, tmp_path, monkeypatch):
        from cru_harness.baselines.whp import WHPError, read_whp

        (tmp_path / "base").mkdir()
        (tmp_path / "base" / "config.json").write_text("{}")
        root = self.whp_dir(tmp_path, str(tmp_path / "base"))
        assert read_whp(root).baseline == str(tmp_path / "base")
        (root / "reinforced").rename(tmp_path / "elsewhere")
        (root / "reinforced").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
        with pytest.raises(WHPError, match="is a symbolic link"):
            read_whp(root)
        root = self.whp_dir(tmp_path / "b", str(tmp_path / "no" / "base"))
        with pytest.raises(WHPError, match="its starting model .* does not exist"):
            read_whp(root)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
        import huggingface_hub.constants as hub_constants

        monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
        root = self.whp_dir(tmp_path / "c", "acme/never-downloaded")
        with pytest.raises(WHPError, match="not in the local cache, and the Hub is off"):
            read_whp(root)


def test_the_kernels_hub_notice_of_bitsandbytes_is_the_only_message_dropped():
    """A one-line error stays one line: bitsandbytes' notice that it cannot fetch its optional 4-bit CPU kernel from
    the Hub (printed at import on an AVX512-BF16 CPU without the `kernels` package) is dropped, nothing else of it."""
    import logging

    import cru_harness

    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")

    def kept(msg):
        record = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, msg, (), None)
        return all(f.filter(record) for f in logger.filters)

    assert not kept(cru_harness.KERNELS_HUB_NOTICE + ": %s. Please make sure you already `pip install kernels`")
    assert kept("Failed to load the CPU library") and kept("something else went wrong")
    done = subprocess.run([sys.executable, "-c", "import cru_harness, bitsandbytes"], capture_output=True, text=True)
    assert done.returncode == 0 and "kernels-community" not in done.stderr, done.stderr
