"""LoRA (PEFT) through the training engine: an adapter trains, saves as a PEFT directory, loads through lm-eval's
`peft=` path with the trained scores, and the base stays untouched; its settings validate themselves."""
import json

import pytest
import torch
from safetensors.torch import load_file

import cru_harness.baselines as B
from cru_harness.errors import InputError
from cru_harness.training.lora import LoraSettings, lora_presets

from test_baselines_training import FORGET, RETAIN, base_dir  # noqa: F401 (fixture)



def test_npo_trains_a_lora_adapter_that_lm_eval_loads_with_peft(base_dir, tmp_path):
    before = {k: v.clone() for k, v in load_file(base_dir / "model.safetensors").items()}
    config = B.get_method("npo").Config(learning_rate=5e-2, num_epochs=2, warmup_epochs=0.0, effective_batch_size=4,
                                        micro_batch_size=2, lr_scheduler="constant")
    out = tmp_path / "npo_lora"
    result = B.unlearn(str(base_dir), None, FORGET, RETAIN, "npo", config, out_dir=out, progress=False,
                       lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}, gradient_checkpointing=True)
    # a PEFT adapter directory naming its base, and only the adapter's weights trained
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert adapter["base_model_name_or_path"] == str(base_dir)
    weights = load_file(out / "adapter_model.safetensors")
    assert weights and all("lora_" in k for k in weights)
    assert any(v.abs().max() > 0 for k, v in weights.items() if "lora_B" in k)   # B starts at 0: it moved
    assert result.resources["trainable_params"] == sum(v.numel() for v in weights.values())
    assert json.loads((out / "unlearn_record.json").read_text())["lora"]["r"] == 4
    # the base checkpoint is untouched
    after = load_file(base_dir / "model.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    # lm-eval's HF model with peft= scores as the trained model does, and not as the base does
    from lm_eval.models.huggingface import HFLM

    request = [("Question: Who wrote The Blue Harbor?\nAnswer:", " Ana Lopez wrote The Blue Harbor in 1990.")]

    def score(**kw):
        lm = HFLM(pretrained=str(base_dir), device="cpu", batch_size=1, **kw)
        from lm_eval.api.instance import Instance

        return lm.loglikelihood([Instance("loglikelihood", {}, r, 0) for r in request], disable_tqdm=True)[0][0]

    with_adapter, base = score(peft=str(out)), score()
    assert with_adapter < base - 1e-3   # NPO lowered the forget answer's likelihood through the adapter only
    # `--model cru` (HFLM underneath) takes the same peft= argument, and the runner hands it the adapter that way
    from cru_harness.lmeval.model import CRULM
    from cru_harness.runner.config import ModelSpec
    from cru_harness.runner.evaluation import eval_model_args
    from lm_eval.api.instance import Instance

    cru = CRULM(pretrained=str(base_dir), peft=str(out), device="cpu", batch_size=1)
    assert cru.loglikelihood([Instance("loglikelihood", {}, r, 0) for r in request],
                             disable_tqdm=True)[0][0] == pytest.approx(with_adapter, abs=1e-5)
    spec = ModelSpec(name="tiny", path=str(base_dir), dtype="float32")
    assert eval_model_args(spec, str(out)) == {"pretrained": str(base_dir), "peft": str(out), "dtype": "float32"}


def test_lora_settings_validate_themselves_and_rwku_is_a_preset():
    # RWKU's package publishes it (`Benchmark.lora_preset`): LLaMA-Factory's r 8, alpha 16 on q_proj, v_proj
    assert set(lora_presets()) == {"rwku"}
    assert LoraSettings.from_dict("rwku") == LoraSettings(r=8, alpha=16.0, dropout=0.0,
                                                          target_modules=("q_proj", "v_proj"))
    assert LoraSettings.from_dict({"preset": "rwku", "r": 16}).r == 16
    assert LoraSettings(target_modules="q_proj, v_proj").target_modules == ("q_proj", "v_proj")
    for bad, match in [({"r": 0}, "lora.r"), ({"alpha": -1}, "lora.alpha"), ({"dropout": 1.0}, "lora.dropout"),
                       ({"rank": 8}, "unknown key"), ({"preset": "tofu"}, "lora.preset"),
                       ({"target_modules": []}, "target_modules")]:
        with pytest.raises(InputError, match=match):
            LoraSettings.from_dict(bad)


def test_methods_that_pick_their_own_weights_refuse_lora(base_dir):
    for name, extra in (("rmu", {"layer": 1}), ("task_vector", {})):
        config = B.get_method(name).Config(**extra)
        with pytest.raises(InputError, match="with lora"):
            B.unlearn(str(base_dir), None, FORGET, RETAIN, name, config, progress=False, lora="rwku")
