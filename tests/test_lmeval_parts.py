"""The `cru` model's parts: a method's own model loader (the hook WHP uses) and `base=` naming lm-eval's output
folder as `pretrained=` does."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from cru_harness import api, plugins
from cru_harness.lmeval.model import CRULM
from cru_harness.lmeval.registration import base_argument, patch_output_name
from test_lmeval_support import shared_tiny_dir


class _Scaled(torch.nn.Module):
    """The served model of the toy loader: the checkpoint's logits times a factor (anything other than HF's)."""

    def __init__(self, model, factor):
        super().__init__()
        self.inner, self.factor = model, factor
        self.config, self.device, self.dtype = model.config, model.device, model.dtype
        self.generation_config = model.generation_config

    def tie_weights(self):   # HFLM calls it after loading
        self.inner.tie_weights()

    def forward(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        out.logits = out.logits * self.factor
        return out


class _ToyLoader(api.ModelLoader):
    name = "Toy"

    def __init__(self, directory, manifest):
        self.checkpoint = str(directory / manifest["inner"])
        self.factor = manifest["factor"]
        self.loaded: list[str] = []

    def build(self, model, load):
        self.loaded.append(type(model).__name__)
        return _Scaled(model, self.factor)

    def identity(self):
        return {"toy": self.factor}

    def info(self):
        return {"cru_toy": {"factor": self.factor}}


class _ToyMethod(api.Method):
    name = "ToyLoaded"

    def model_loader(self, path):
        from pathlib import Path

        manifest = Path(path) / "toy.json"
        return _ToyLoader(Path(path), json.loads(manifest.read_text())) if manifest.is_file() else None


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return shared_tiny_dir(tmp_path_factory)


def test_a_methods_loader_builds_the_model_served(tiny_dir, tmp_path):
    """A directory a method's `model_loader` claims is served as that loader builds it (what WHP's pair uses):
    the lm-eval model knows no method, and routers on such a model are refused."""
    toy = tmp_path / "toy"
    shutil.copytree(tiny_dir, toy / "inner")
    (toy / "toy.json").write_text(json.dumps({"inner": "inner", "factor": 0.5}))
    plugins.methods.register(_ToyMethod())
    try:
        lm = CRULM(base=str(toy), device="cpu", batch_size=2)
        plain = CRULM(base=str(tiny_dir), device="cpu", batch_size=2)
        assert isinstance(lm.model, _Scaled) and lm.loader.loaded == ["LlamaForCausalLM"]
        assert lm.pretrained == str(toy / "inner") and plain.loader is None
        ids = torch.tensor([[1, 5, 9, 3]])
        with torch.no_grad():
            assert torch.allclose(lm.model(input_ids=ids).logits, 0.5 * plain.model(input_ids=ids).logits)
        assert lm.get_model_info()["cru_toy"] == {"factor": 0.5}
        assert lm.cache_identity()["base"]["toy"] == 0.5
        with pytest.raises(ValueError, match="is a Toy model; router bundles attach to one base"):
            CRULM(base=str(toy), routers=str(tmp_path / "bundle"), device="cpu")
    finally:
        plugins.methods.unregister("ToyLoaded")


def test_base_names_the_output_folder_as_pretrained_does():
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker

    patch_output_name()
    patch_output_name()   # idempotent

    def folder(model_args):
        tracker = GeneralConfigTracker()
        tracker.log_experiment_args(model_source="cru", model_args=model_args, system_instruction=None,
                                    chat_template=None, fewshot_as_multiturn=False)
        return tracker.model_name_sanitized

    assert folder("base=/runs/m1,routers=/runs/r1") == folder("pretrained=/runs/m1,routers=/runs/r1") == "__runs__m1"
    assert folder({"base": "zoo:llama", "batch_size": 2}) == "zoo__llama"
    assert folder("pretrained=a,base=b") == "a"   # lm-eval's own name first (the cru model refuses the pair)
    assert base_argument("routers=x") is None and base_argument(None) is None
