"""Issue 48: bad inputs, tried as a hostile or careless user would, organised by the issue's classes (one test class
per class), so that a new instance of a class meets the check of the whole class. Fast: unit-level checks of the
validation functions, test doubles for executors, a config.json-only directory where a model path is needed; no
model is loaded or trained."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cru_harness.errors import UserError


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

        from cru_harness.lmeval.model import CRULM, ModelArgumentError

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
        from cru_harness.lmeval.model import ModelArgumentError, boolean_arguments, check_boolean_arguments

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


# --------------------------------------------------------------------------------------------------- class 4
class TestEmptyModelArguments:
    """Class 4: `routers=` empty scored the base as if it were CRU (rc 0, no warning). An argument given with no
    value is refused, naming it, before anything loads; leaving `routers` out still gives the base alone."""

    @pytest.mark.parametrize("spec, name", [("routers=", "routers"), ("routers= ", "routers"),
                                            ("routers=,dtype=float32", "routers"), ("dtype=", "dtype"),
                                            ("revision=", "revision")])
    def test_an_empty_argument_is_refused_by_name(self, spec, name, fake_model_dir, hflm_calls):
        from lm_eval.utils import simple_parse_args_string

        from cru_harness.lmeval.model import CRULM, ModelArgumentError

        args = simple_parse_args_string(f"base={fake_model_dir},{spec}")
        with pytest.raises(ModelArgumentError, match=f"cru model: {name}= is empty in --model_args"):
            CRULM(device="cpu", **args)
        assert hflm_calls == []

    @pytest.mark.parametrize("routers, words", [([], "routers=\\[\\] names no bundle"),
                                                (False, "routers=False in --model_args is not a bundle")])
    def test_routers_that_name_no_bundle_are_refused(self, routers, words, fake_model_dir, hflm_calls):
        from cru_harness.lmeval.model import CRULM, ModelArgumentError

        with pytest.raises(ModelArgumentError, match=words):
            CRULM(base=str(fake_model_dir), routers=routers, device="cpu")
        assert hflm_calls == []

    def test_an_empty_base_is_refused_and_no_routers_means_the_base_alone(self, fake_model_dir, hflm_calls):
        from cru_harness.lmeval.model import CRULM, ModelArgumentError

        with pytest.raises(ModelArgumentError, match="base= is empty"):
            CRULM(base="", routers=str(fake_model_dir), device="cpu")
        with pytest.raises(StopBeforeLoading):   # no routers argument at all: the base is loaded as it is
            CRULM(base=str(fake_model_dir), device="cpu")
        assert len(hflm_calls) == 1
