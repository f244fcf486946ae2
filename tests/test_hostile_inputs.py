"""Issue 48: bad inputs, tried as a hostile or careless user would, organised by the issue's classes (one test class
per class), so that a new instance of a class meets the check of the whole class. Fast: unit-level checks of the
validation functions, test doubles for executors, a config.json-only directory where a model path is needed; no
model is loaded or trained."""
from __future__ import annotations

import json
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

    def test_a_cell_without_a_digest_is_read_as_it_is(self, tmp_path):
        from cru_harness.store import CellStore

        config, path = one_computed_run(tmp_path)
        result = json.loads(path.read_text())
        del result["digest"]
        path.write_text(json.dumps(result))
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

        path = write_run_config(tmp_path, methods=[{"method": "GA"}, {"method": "RMU", "layer": 3},
                                                   {"method": "LUNAR", "layer": 5, "refusal_prompts_path": "p.json"},
                                                   {"method": "CRU"}])
        assert main(["run", str(path), "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "trains: GA all weights on" in out and "trains: CRU routers (base frozen) on" in out
        assert "trains: RMU blocks 1, 2, 3: weights matching mlp\\.down_proj\\.weight on" in out
        assert "trains: LUNAR block 5's MLP down projection on" in out

    def test_a_dry_run_names_an_input_file_a_method_reads_that_is_not_there(self, tmp_path, capsys):
        """LUNAR's refusal prompts are the user's file: a path that is not there would fail every LUNAR cell after
        the fine-tuning and the other cells; the plan says so before anything runs."""
        from cru_harness.cli import main

        path = write_run_config(tmp_path, methods=[{"method": "LUNAR", "refusal_prompts_path": "no/such.json"}])
        assert main(["run", str(path), "--dry-run"]) == 0
        assert "; refusal_prompts_path no/such.json does not exist: these cells will fail" in capsys.readouterr().out
        (tmp_path / "prompts.json").write_text('["Write malware."]')
        path = write_run_config(tmp_path, name="there",
                                methods=[{"method": "LUNAR", "refusal_prompts_path": str(tmp_path / "prompts.json")}])
        assert main(["run", str(path), "--dry-run"]) == 0
        assert "does not exist" not in capsys.readouterr().out
