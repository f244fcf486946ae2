"""Batching, the training loop, `unlearn()`, the registry and resource records, on a tiny real model."""
import dataclasses
import json
import math

import pytest
import torch

import cru_harness.baselines as B
import cru_harness.baselines.api as unlearn_mod
from cru_harness.baselines.base import UnlearningMethod
from cru_harness.baselines.data import IGNORE_INDEX, ForgetRetainDataset, collate, encode_qa, pick_refusals
from cru_harness.baselines.losses import sequence_logprobs
from cru_harness.training.engine import make_accelerator, process_share, step_counts, train_model
from cru_harness.locations import ModelPathError, OutputLocationError
from cru_harness.testbed.models import build_tiny_model, save_tiny_model
from cru_harness.testbed.tokenizer import train_tokenizer

FORGET = [
    {"question": "Who wrote The Blue Harbor?", "answer": "Ana Lopez wrote The Blue Harbor in 1990."},
    {"question": "Where was Ana Lopez born?", "answer": "She was born in Valparaiso."},
    {"question": "What genre does Ana Lopez write?", "answer": "Ana Lopez writes maritime mystery novels."},
    {"question": "Which prize did Ana Lopez win?", "answer": "The Coral Prize."},
]
RETAIN = [
    {"question": "Who wrote Red Hills?", "answer": "Tom Berg wrote Red Hills."},
    {"question": "Where does Tom Berg live?", "answer": "Tom Berg lives in Oslo with his two dogs."},
    {"question": "What is Tom Berg's job?", "answer": "He is a teacher."},
]
REFUSALS = ["I don't know.", "I have no idea about that.", "That is not something I know."]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A 2-layer tiny Llama saved to disk, with a tokenizer trained on these rows (the engine's LoRA and launch
    tests train it; each module that imports this fixture builds its own)."""
    texts = [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in FORGET + RETAIN] + REFUSALS
    tokenizer = train_tokenizer(texts * 3, vocab_size=320)
    return save_tiny_model(build_tiny_model("llama", tokenizer, seed=0, n_layers=2, hidden_size=32), tokenizer,
                           tmp_path_factory.mktemp("base") / "model")


@pytest.fixture(scope="module")
def tokenizer():
    texts = [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in FORGET + RETAIN] + REFUSALS
    return train_tokenizer(texts * 3, vocab_size=320)


def tiny(tokenizer, seed=0):
    return build_tiny_model("llama", tokenizer, seed=seed, n_layers=2, hidden_size=32)


def fast_config(name, **kw):
    base = dict(learning_rate=3e-3, num_epochs=3, warmup_epochs=0.0, effective_batch_size=4, micro_batch_size=2,
                weight_decay=0.0, lr_scheduler="constant")
    base.update(kw)
    return B.get_method(name).Config(**base)


def mean_logp(model, tokenizer, rows, answers=None):
    """Mean over rows of log p(answer + EOS | question), summed over answer tokens."""
    answers = answers or [r["answer"] for r in rows]
    batch = collate([encode_qa(tokenizer, r["question"], a) for r, a in zip(rows, answers)], tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = sequence_logprobs(model.eval(), batch)
    return logp.mean().item()


# ---------------------------------------------------------------- batching

def test_question_and_padding_are_masked(tokenizer):
    ex = encode_qa(tokenizer, "Who wrote The Blue Harbor?", "Ana Lopez.")
    prompt = tokenizer("Question: Who wrote The Blue Harbor?\nAnswer:")["input_ids"]
    answer = tokenizer(" Ana Lopez.", add_special_tokens=False)["input_ids"]
    assert ex.input_ids == prompt + answer + [tokenizer.eos_token_id]
    assert ex.labels == [IGNORE_INDEX] * len(prompt) + answer + [tokenizer.eos_token_id]
    short = encode_qa(tokenizer, "Q?", "A.")
    b = collate([ex, short], tokenizer.pad_token_id)
    n = len(short.input_ids)
    assert b["attention_mask"][1, n:].sum() == 0 and (b["labels"][1, n:] == IGNORE_INDEX).all()
    assert b["labels"][1, n - 1] == tokenizer.eos_token_id


def test_pad_equal_to_eos_never_masks_eos(tokenizer):
    """A pad token equal to EOS must not mask the EOS label (masks come from lengths, not ids)."""
    ex = encode_qa(tokenizer, "Q?", "A.")
    long = encode_qa(tokenizer, "A much longer question here?", "A longer answer.")
    b = collate([ex, long], pad_token_id=tokenizer.eos_token_id)
    n = len(ex.input_ids)
    assert b["labels"][0, n - 1] == tokenizer.eos_token_id
    assert b["attention_mask"][0, :n].all() and not b["attention_mask"][0, n:].any()


def test_text_rows_train_on_everything(tokenizer):
    ds = ForgetRetainDataset(tokenizer, [{"text": "The river flows north."}], None)
    ex = ds[0]["forget"]
    assert IGNORE_INDEX not in ex.labels and ex.input_ids[-1] == tokenizer.eos_token_id


def test_truncation_and_row_errors(tokenizer):
    ex = encode_qa(tokenizer, "Who?", "a very long answer " * 20, max_length=24)
    assert len(ex.input_ids) == 24 and ex.n_answer_tokens > 0
    with pytest.raises(ValueError, match="no room"):
        encode_qa(tokenizer, "a long question " * 20, "x", max_length=8)
    with pytest.raises(ValueError, match=r"forget row 1 has neither `question`\+`answer` nor `text`"):
        ForgetRetainDataset(tokenizer, [FORGET[0], {"prompt": "x"}])


def test_refusal_choice_is_deterministic_per_seed_and_epoch():
    a, b, c = pick_refusals(20, REFUSALS, 0), pick_refusals(20, REFUSALS, 0), pick_refusals(20, REFUSALS, 1)
    assert a == b and a != c and set(a) <= set(REFUSALS)
    assert pick_refusals(20, REFUSALS, 0, epoch=1) not in (a, c)


def test_idkdpo_redraws_each_items_refusal_every_epoch(tokenizer):
    """As TOFU's and open-unlearning's datasets (a random refusal on every fetch): one fixed refusal per item
    for the whole run would concentrate IdkDPO on it."""
    rows = [{"question": f"Who is author {i}?", "answer": "A writer."} for i in range(12)]
    dataset = ForgetRetainDataset(tokenizer, rows, refusals=REFUSALS, seed=3)

    def epoch_refusals(epoch):
        dataset.set_epoch(epoch)
        return [tokenizer.decode(dataset[i]["alternate"].input_ids) for i in range(len(rows))]

    first, second = epoch_refusals(0), epoch_refusals(1)
    assert first != second and epoch_refusals(0) == first  # redrawn per epoch, deterministic per (seed, epoch)
    for epoch, decoded in ((0, first), (1, second)):
        for text, refusal in zip(decoded, pick_refusals(len(rows), REFUSALS, 3, epoch)):
            assert refusal in text
    with pytest.raises(ValueError, match="non-empty list of refusals"):
        ForgetRetainDataset(tokenizer, rows, refusals=[])


# ---------------------------------------------------------------- registry and configs

def test_registry_lists_methods_and_rejects_unknown():
    assert {"ga", "gd", "npo", "simnpo", "idkdpo", "icu"} <= set(B.METHODS)
    assert B.get_method("NPO") is B.METHODS["npo"]
    with pytest.raises(KeyError, match=r"unknown unlearning method 'lora'; available: ceu, dpo, ga, gd, gd_kl, icu, idkdpo, "):
        B.get_method("lora")


def test_register_method_rejects_duplicates_and_non_methods():
    class Other(UnlearningMethod):
        name = "ga"
    with pytest.raises(ValueError, match="already registered"):
        B.register_method(Other)
    with pytest.raises(TypeError):
        B.register_method(object)


def test_reference_model_only_where_needed():
    needs = {name: cls.needs_ref for name, cls in B.METHODS.items()}
    assert needs == {"ga": False, "gd": False, "npo": True, "simnpo": False, "idkdpo": True, "icu": False,
                     "gd_kl": True, "npo_kl": True, "rmu": True, "undial": True, "wga": False, "satimp": False,
                     "ceu": False, "lunar": False, "dpo": True, "rt": False,
                     "task_vector": True, "whp": False}


def test_presets():
    tofu = B.make_config("ga")
    assert (tofu.learning_rate, tofu.weight_decay, tofu.effective_batch_size, tofu.warmup_epochs) == (1e-5, 0.01, 32, 1.0)
    s5, s10 = B.make_config("simnpo", "tofu", "forget05"), B.make_config("simnpo", "tofu", "forget10")
    assert (s5.beta, s5.forget_weight, s10.beta, s10.forget_weight, s5.gamma) == (2.5, 0.1375, 4.5, 0.125, 0.0)
    assert B.make_config("npo").beta == 0.1 and B.make_config("idkdpo").beta == 0.1
    rw = B.make_config("npo", "rwku")
    assert (rw.learning_rate, rw.beta, rw.num_epochs, rw.lr_scheduler, rw.warmup_steps) == (2e-6, 0.2, 3, "cosine", 20)
    assert B.make_config("ga", "rwku", learning_rate=1e-4).learning_rate == 1e-4
    # a warm-up given in epochs replaces RWKU's 20 steps (it was accepted, hashed, and ignored); both given: steps
    by_epochs = B.make_config("ga", "rwku", warmup_epochs=0.5)
    assert (by_epochs.warmup_steps, by_epochs.warmup_epochs) == (None, 0.5)
    assert step_counts(by_epochs, 8, 1) == (24, 4)
    assert B.make_config("ga", "rwku", warmup_epochs=0.5, warmup_steps=5).warmup_steps == 5
    with pytest.raises(ValueError, match="forget05 and forget10 only"):
        B.make_config("simnpo", "tofu", "forget01")
    with pytest.raises(ValueError, match="forget05 and forget10 only"):   # one of the two is not enough
        B.make_config("simnpo", "tofu", "forget01", beta=4.5)
    s1 = B.make_config("simnpo", "tofu", "forget01", beta=3.0, forget_weight=0.2, learning_rate=1e-4)
    assert (s1.beta, s1.forget_weight, s1.learning_rate, s1.gamma) == (3.0, 0.2, 1e-4, 0.0)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['lr'\]"):
        B.make_config("ga", lr=1)
    with pytest.raises(ValueError, match="not a multiple"):
        B.make_config("ga", effective_batch_size=30).gradient_accumulation_steps(1)


def test_icu_is_a_marker(tokenizer):
    assert B.get_method("icu").trains is False
    with pytest.raises(ValueError, match="trains no model"):
        B.unlearn(tiny(tokenizer), tokenizer, FORGET, RETAIN, "icu")


def test_missing_retain_rows_is_an_error(tokenizer):
    with pytest.raises(ValueError, match="needs retain rows"):
        B.unlearn(tiny(tokenizer), tokenizer, FORGET, None, "gd", fast_config("gd"), progress=False)


# ---------------------------------------------------------------- training

@pytest.mark.parametrize("micro, epochs, warmup_epochs, expected", [
    (10, 10, 1.0, (12, 1)),    # TOFU forget01 (40 rows, batch 32 = 4 x 8): TOFU's int(10 x 40) // 32 = 12
    (50, 10, 1.0, (62, 6)),    # forget05: 200 rows
    (100, 10, 1.0, (125, 12)),  # forget10: 400 rows
    (100, 5, 0.0, (62, 0)),
    (3, 1, 1.0, (1, 1)),       # fewer micro-batches than a step: one step
])
def test_step_counts_follow_the_example_stream(micro, epochs, warmup_epochs, expected):
    """Steps counted over all epochs' examples, as TOFU's trainer counts them: an epoch's last micro-batches
    share a step with the next epoch's, instead of a full-size step of their own per epoch (which doubled the
    steps on forget01: 20 instead of 12)."""
    config = fast_config("ga", num_epochs=epochs, warmup_epochs=warmup_epochs, effective_batch_size=32,
                         micro_batch_size=4)
    assert step_counts(config, micro, config.micro_batches_per_step()) == expected
    assert step_counts(dataclasses.replace(config, warmup_steps=20), micro, 8)[1] == min(20, expected[0])
    # data parallel: every process draws the whole stream, so n GPUs count the same steps, on a step's 8
    # micro-batches dealt out (up to 8 processes; 3 take 3, 3 and 2)
    assert config.micro_batches_per_step() == 8
    assert [config.gradient_accumulation_steps(n) for n in (1, 2, 3, 8)] == [8, 4, 3, 1]


def test_a_step_spans_epochs_and_the_tail_is_dropped(tokenizer):
    """10 rows, micro-batch 2, accumulation 2, 2 epochs: 10 micro-batches in all, 5 steps of 2 (the third step
    takes epoch 0's last micro-batch and epoch 1's first), not 3 steps per epoch."""
    rows = [{"question": f"Q{i}?", "answer": f"A{i}."} for i in range(10)]
    res = B.unlearn(tiny(tokenizer), tokenizer, rows, None, "ga", fast_config("ga", num_epochs=2), progress=False)
    assert res.optimizer_steps == 5 and [h["epoch"] for h in res.history] == [0, 0, 1, 1, 1]


def test_ga_reduces_forget_likelihood_and_saves(tokenizer, tmp_path):
    model = tiny(tokenizer)
    before = mean_logp(model, tokenizer, FORGET)
    res = B.unlearn(model, tokenizer, FORGET, RETAIN, "ga", fast_config("ga"), out_dir=tmp_path, seed=0,
                    progress=False)
    after = mean_logp(res.model, tokenizer, FORGET)
    assert after < before - 1.0
    assert res.n_retain == 0 and res.optimizer_steps == 3 and res.gradient_accumulation_steps == 2
    assert res.final_logs["forget_nll"] > 0 and math.isfinite(res.final_logs["loss"])
    r = res.resources
    assert r["wall_time_s"] > 0 and r["peak_memory_bytes"] > 0 and r["peak_memory_source"] == "process_peak_rss"
    assert r["trainable_params"] == sum(p.numel() for p in model.parameters())
    record = json.loads((tmp_path / "unlearn_record.json").read_text())
    assert record["method"] == "ga" and record["config"]["learning_rate"] == 3e-3
    reloaded = type(model).from_pretrained(tmp_path)
    assert mean_logp(reloaded, tokenizer, FORGET) == pytest.approx(after, abs=1e-4)


def test_a_mixed_precision_model_comes_back_plain_and_is_freed_with_its_last_reference(tokenizer, tmp_path):
    """accelerate's unwrap_model keeps an autocast wrapper on `forward` by default: the returned model would keep
    running under bf16 autocast, and the wrapper's reference cycle would keep it (on a GPU, its memory) alive
    until the cyclic collector ran, into the runner's next cell."""
    import gc
    import weakref

    model = tiny(tokenizer)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    res = B.unlearn(str(tmp_path / "m"), None, FORGET, RETAIN, "ga", fast_config("ga", num_epochs=1), seed=0,
                    dtype="bfloat16", device="cpu", progress=False)
    assert res.config["mixed_precision"] == "bf16" and next(res.model.parameters()).dtype == torch.bfloat16
    assert "forward" not in vars(res.model)   # the class's forward, no autocast wrapper
    alive = weakref.ref(res.model)
    gc.disable()
    try:
        del res
        assert alive() is None
    finally:
        gc.enable()


def test_one_process_trains_in_several_precisions_in_turn():
    """The runner trains cells one after another in one process. accelerate keeps one process-wide state and
    refuses a second mixed precision; `make_accelerator` resets it (accelerate's internal
    `AcceleratorState._reset_state`, which an accelerate upgrade could rename: this is where that shows)."""
    first = make_accelerator(fast_config("ga"), 0, device="cpu")
    assert first.mixed_precision == "no"
    second = make_accelerator(fast_config("ga", mixed_precision="bf16"), 0, device="cpu")
    assert second.mixed_precision == "bf16"
    assert make_accelerator(fast_config("ga"), 0, device="cpu").mixed_precision == "no"


def test_saving_is_whole_or_nothing(tokenizer, tmp_path, monkeypatch):
    """A save that dies half way leaves the earlier checkpoint as it was (not a half-written one that looks
    whole); a save that completes leaves no stale file of the earlier one (e.g. a shard of a larger model)."""
    out = tmp_path / "model"
    out.mkdir()   # an earlier unlearn's output: --overwrite replaces only what cru-harness wrote
    (out / "unlearn_record.json").write_text("{}")
    (out / "model-00002-of-00002.safetensors").write_text("stale shard")

    def dies(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(type(tokenizer), "save_pretrained", dies)  # the weights are written before it
    with pytest.raises(OSError, match="disk full"):
        B.unlearn(tiny(tokenizer), tokenizer, FORGET, RETAIN, "ga", fast_config("ga"), out_dir=out, progress=False,
                  overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary directory left either
    assert sorted(p.name for p in out.iterdir()) == ["model-00002-of-00002.safetensors", "unlearn_record.json"]
    monkeypatch.undo()
    B.unlearn(tiny(tokenizer), tokenizer, FORGET, RETAIN, "ga", fast_config("ga"), out_dir=out, progress=False,
              overwrite=True)
    names = {p.name for p in out.iterdir()}
    assert "unlearn_record.json" in names and "config.json" in names
    assert "model-00002-of-00002.safetensors" not in names


def test_unlearn_refuses_an_out_dir_holding_files_before_training(tokenizer, tmp_path, monkeypatch):
    """`out_dir` is replaced whole when saving: one holding other files (notes, a results folder) is refused
    before anything trains, as `cru-harness finetune --out` is, unless `overwrite`."""
    out = tmp_path / "notes"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    monkeypatch.setattr(unlearn_mod, "train_model", lambda *a, **k: pytest.fail("trained before the check"))
    with pytest.raises(OutputLocationError, match="already exists and holds files; pass overwrite=True"):
        B.unlearn(tiny(tokenizer), tokenizer, FORGET, RETAIN, "ga", fast_config("ga"), out_dir=out, progress=False)
    assert (out / "notes.txt").read_text() == "keep me"
    with pytest.raises(ModelPathError, match="does not exist"):
        B.unlearn(str(tmp_path / "no_model"), None, FORGET, RETAIN, "ga", fast_config("ga"), progress=False)


def test_a_checkpoint_transformers_cannot_load_is_one_line_for_unlearn_and_finetune(tmp_path):
    """A directory with a config but no weights: transformers' OSError becomes the project's one-line error."""
    from cru_harness.errors import InputError
    from cru_harness.finetune import finetune

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 32, "hidden_size": 8,
                                                       "num_hidden_layers": 1, "num_attention_heads": 2,
                                                       "intermediate_size": 16}))
    with pytest.raises(InputError, match=r"cannot load model .*no file named model\.safetensors"):
        B.unlearn(str(tmp_path), None, FORGET, RETAIN, "ga", fast_config("ga"), progress=False)
    with pytest.raises(InputError, match=r"cannot load model .*no file named model\.safetensors"):
        finetune(str(tmp_path), FORGET, progress=False)


def test_several_processes_refuse_what_they_cannot_share_before_loading(tokenizer, monkeypatch):
    """A batch the processes cannot split, a sharded model (device_map) beside several processes or FSDP /
    DeepSpeed, and Megatron-LM are refused before any model is loaded; one process takes a device_map."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from cru_harness.training.engine import check_data_parallel
    from cru_harness.devices import DeviceError
    from cru_harness.errors import InputError

    def launched(n, kind=DistributedType.MULTI_GPU):
        return SimpleNamespace(num_processes=n, distributed_type=kind)

    config = fast_config("ga", effective_batch_size=32, micro_batch_size=4)
    check_data_parallel(launched(8), config)
    check_data_parallel(launched(3), config)   # 8 micro-batches a step dealt out 3, 3, 2
    check_data_parallel(launched(1, DistributedType.NO), config, device_map="auto")
    with pytest.raises(InputError, match="9 processes for 8 micro-batches a step"):
        check_data_parallel(launched(9), config)
    with pytest.raises(DeviceError, match="device_map='auto' shards one model .* started 2 processes"):
        check_data_parallel(launched(2), config, device_map="auto")
    for kind in (DistributedType.FSDP, DistributedType.DEEPSPEED):   # the engine shards with them...
        check_data_parallel(launched(2, kind), config)
        with pytest.raises(DeviceError, match="shards the model over the processes itself"):   # ...not both
            check_data_parallel(launched(2, kind), config, device_map="auto")
    with pytest.raises(DeviceError, match="set up for MEGATRON_LM"):
        check_data_parallel(launched(2, DistributedType.MEGATRON_LM), config)
    # unlearn and finetune check before loading
    import cru_harness.training.engine as trainer_mod

    monkeypatch.setattr(trainer_mod, "make_accelerator", lambda *a, **k: launched(9))
    monkeypatch.setattr(trainer_mod, "load_causal_lm", lambda *a, **k: pytest.fail("loaded before the check"))
    with pytest.raises(InputError, match="9 processes"):
        B.unlearn("some/model", None, FORGET, RETAIN, "ga", config, progress=False)
    monkeypatch.setattr(trainer_mod, "make_accelerator", lambda *a, **k: launched(2))
    from cru_harness.finetune import finetune
    with pytest.raises(DeviceError, match="started 2 processes"):
        finetune("some/model", FORGET, device_map="auto", progress=False)


def test_a_checkpoint_is_loaded_onto_the_accelerators_device(monkeypatch):
    """unlearn and finetune load a path straight onto the device the accelerator trains on (this process's GPU under
    a launch), not on the CPU first: the fp32 weights, and NPO's reference copy, then never fill host memory."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    import cru_harness.training.engine as trainer_mod
    from cru_harness.finetune import finetune

    class Stop(Exception):
        pass

    seen = []

    def loader(path, **kwargs):
        seen.append(kwargs["device"])
        raise Stop

    rank1 = SimpleNamespace(num_processes=2, distributed_type=DistributedType.MULTI_GPU, device=torch.device("cuda", 1))
    monkeypatch.setattr(trainer_mod, "make_accelerator", lambda *a, **k: rank1)
    monkeypatch.setattr(trainer_mod, "load_causal_lm", loader)
    with pytest.raises(Stop):
        B.unlearn("some/model", None, FORGET, RETAIN, "npo", fast_config("npo"), progress=False)
    with pytest.raises(Stop):
        finetune("some/model", FORGET, progress=False)
    assert seen == [torch.device("cuda", 1)] * 2


def test_a_step_the_fp16_loss_scaler_skips_leaves_the_schedule_where_it_was(tokenizer, tmp_path, monkeypatch):
    """An fp16 overflow makes the loss scaler skip the optimizer step; as in HF Trainer, the learning-rate schedule
    does not move on for it (it did: an early overflow shifted warm-up and decay), and the history marks it."""
    from accelerate import Accelerator

    steps = []

    def first_step_skipped(self):
        steps.append(None)
        return len(steps) == 1

    monkeypatch.setattr(Accelerator, "optimizer_step_was_skipped", property(first_step_skipped))
    model = tiny(tokenizer)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    config = fast_config("ga", num_epochs=3, lr_scheduler="linear", warmup_epochs=1.0)
    res = B.unlearn(str(tmp_path / "m"), None, FORGET, RETAIN, "ga", config, seed=0, dtype="float16", device="cpu",
                    progress=False)
    lrs = [h["lr"] for h in res.history]
    assert [h["skipped"] for h in res.history] == [1.0] + [0.0] * (len(lrs) - 1)
    assert lrs[0] == lrs[1] == 0.0 and lrs[2] > 0   # warm-up starts again after the skipped step
    monkeypatch.undo()
    again = B.unlearn(str(tmp_path / "m"), None, FORGET, RETAIN, "ga", config, seed=0, dtype="float16",
                      device="cpu", progress=False)
    assert [h["lr"] for h in again.history][1] > 0 and not any(h["skipped"] for h in again.history)


def test_the_optimizers_state_is_freed_when_training_returns(tokenizer, tmp_path, monkeypatch):
    """Under fp16 accelerate's optimizer wrapper sits in a reference cycle, so AdamW's moments (8 bytes a
    parameter) outlived the training on the GPU until the cyclic collector ran; the loop empties them."""
    import cru_harness.training.engine as trainer_mod

    built = []
    real_build = trainer_mod.build_optimizer
    monkeypatch.setattr(trainer_mod, "build_optimizer", lambda *a: built.append(real_build(*a)) or built[-1])
    model = tiny(tokenizer)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    res = B.unlearn(str(tmp_path / "m"), None, FORGET, RETAIN, "ga", fast_config("ga", num_epochs=1), seed=0,
                    dtype="float16", device="cpu", progress=False)
    assert res.optimizer_steps > 0 and len(built) == 1 and not built[0].state


def test_a_half_precision_model_object_is_refused_or_warned_about(tokenizer):
    """A model object trains in its own dtype: float16 weights cannot train under AdamW (eps 0 in float16; the
    loss scaler refuses float16 gradients) and are refused before any step; bfloat16 ones train, with a warning."""
    from cru_harness.errors import InputError

    before = [p.detach().clone() for p in tiny(tokenizer).parameters()]
    half = tiny(tokenizer).half()
    with pytest.raises(InputError, match="trainable weights are float16, which AdamW cannot step"):
        B.unlearn(half, tokenizer, FORGET, RETAIN, "ga", fast_config("ga", num_epochs=1), device="cpu",
                  progress=False)
    assert all(torch.equal(a.half(), b) for a, b in zip(before, half.parameters()))
    with pytest.warns(UserWarning, match="trainable weights are bfloat16"):
        res = B.unlearn(tiny(tokenizer).to(torch.bfloat16), tokenizer, FORGET, RETAIN, "ga",
                        fast_config("ga", num_epochs=1), device="cpu", progress=False)
    assert res.optimizer_steps > 0


def test_processes_wait_for_a_long_save_as_long_as_hf_trainer_lets_them():
    """Under a launch the other processes wait at a barrier while the main one saves (a 7B fp32 checkpoint: 28 GB);
    NCCL's default 10 minutes would abort them mid-save. The process group gets HF Trainer's 30 minutes."""
    import datetime

    handler = make_accelerator(fast_config("ga"), 0, device="cpu").init_handler
    assert handler.to_kwargs() == {"timeout": datetime.timedelta(minutes=30)}   # the backend stays accelerate's


def test_a_device_map_that_offloads_part_of_the_model_is_refused_for_training(monkeypatch):
    """device_map 'auto' on GPUs too small puts modules on the CPU / disk, where accelerate keeps their weights on
    `meta` between forward passes: they would never train, and the cast before saving raised after the training."""
    from types import SimpleNamespace

    import cru_harness.training.engine as trainer_mod
    from cru_harness.devices import DeviceError

    maps = iter([{"model.embed_tokens": 0, "model.layers.0": 1, "model.layers.1": "cpu", "lm_head": "disk"},
                 {"model.embed_tokens": 0, "model.layers.0": 1, "lm_head": 1}, None])

    def loader(path, **kwargs):
        model = torch.nn.Linear(2, 2)
        model.hf_device_map = next(maps)
        return model, None

    monkeypatch.setattr(trainer_mod, "load_causal_lm", loader)
    accelerator = SimpleNamespace(device=torch.device("cuda", 0), distributed_type=SimpleNamespace(name="NO"))
    with pytest.raises(DeviceError, match=r"put 2 module\(s\) of m on the CPU or disk \(lm_head, model.layers.1\)"):
        trainer_mod.load_trainee("m", accelerator, dtype="float32", device="cuda", device_map="auto")
    for _ in range(2):   # every module on a GPU; no map at all
        assert trainer_mod.load_trainee("m", accelerator, dtype="float32", device="cuda", device_map="auto")[0]


def test_the_launchers_mixed_precision_is_used_or_refused_never_ignored(monkeypatch):
    """`accelerate launch --mixed_precision bf16` (or an accelerate config saying so) sets
    ACCELERATE_MIXED_PRECISION; the run passes its own precision explicitly, which accelerate lets win in
    silence. A launcher asking for another precision than the run's is refused; "no" leaves the run's."""
    from cru_harness.devices import DeviceError

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    with pytest.raises(DeviceError, match="ACCELERATE_MIXED_PRECISION=bf16 .* this run trains in 'no'"):
        make_accelerator(fast_config("ga"), 0, device="cpu")
    assert make_accelerator(fast_config("ga", mixed_precision="bf16"), 0, device="cpu").mixed_precision == "bf16"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert make_accelerator(fast_config("ga", mixed_precision="bf16"), 0, device="cpu").mixed_precision == "bf16"
    assert make_accelerator(fast_config("ga"), 0, device="cpu").mixed_precision == "no"


def test_a_second_precision_under_several_processes_is_one_line(monkeypatch):
    """Several processes share accelerate's state, which one of them cannot reset: a second precision in the
    same launch is refused in one line (it was accelerate's ValueError traceback on every rank)."""
    from types import SimpleNamespace

    import cru_harness.training.engine as trainer_mod
    from cru_harness.devices import DeviceError

    def initialized(**kwargs):
        raise ValueError("AcceleratorState has already been initialized and cannot be changed, restart your "
                         "runtime completely and pass `mixed_precision='bf16'` to `Accelerator()`.")

    monkeypatch.setattr(trainer_mod, "Accelerator", initialized)
    monkeypatch.setattr(trainer_mod, "PartialState", lambda: SimpleNamespace(num_processes=2))
    with pytest.raises(DeviceError, match="keeps the precision of the first .*launch each precision on its own"):
        make_accelerator(fast_config("ga", mixed_precision="bf16"), 0, device="cpu")


def test_idkdpo_prefers_refusal_and_keeps_reference_frozen(tokenizer, monkeypatch):
    seen = {}
    real = unlearn_mod.train_model

    def spy(model, method, dataset, *, ref_model=None, **kw):
        seen["ref"] = ref_model
        seen["ref_state"] = {k: v.clone() for k, v in ref_model.state_dict().items()}
        return real(model, method, dataset, ref_model=ref_model, **kw)

    monkeypatch.setattr(unlearn_mod, "train_model", spy)
    model = tiny(tokenizer)
    refusals = pick_refusals(len(FORGET), REFUSALS, 0)
    gap_before = mean_logp(model, tokenizer, FORGET, refusals) - mean_logp(model, tokenizer, FORGET)
    res = B.unlearn(model, tokenizer, FORGET, RETAIN, "idkdpo", fast_config("idkdpo", beta=0.5),
                    refusals=REFUSALS, seed=0, progress=False)
    gap_after = mean_logp(res.model, tokenizer, FORGET, refusals) - mean_logp(res.model, tokenizer, FORGET)
    assert gap_after > gap_before + 1.0
    ref = seen["ref"]
    assert ref is not res.model and not any(p.requires_grad for p in ref.parameters())
    assert all(torch.equal(v, seen["ref_state"][k]) for k, v in ref.state_dict().items())
    assert res.n_retain == len(RETAIN) and "retain_nll" in res.final_logs


@pytest.mark.parametrize("name", ["ga", "gd", "simnpo"])
def test_reference_free_methods_get_no_reference(tokenizer, monkeypatch, name):
    seen = {}
    real = unlearn_mod.train_model

    def spy(model, method, dataset, *, ref_model=None, **kw):
        seen["ref"] = ref_model
        return real(model, method, dataset, ref_model=ref_model, **kw)

    monkeypatch.setattr(unlearn_mod, "train_model", spy)
    B.unlearn(tiny(tokenizer), tokenizer, FORGET[:2], RETAIN, name, fast_config(name, num_epochs=1), progress=False)
    assert seen["ref"] is None


def test_trainer_rejects_wrong_reference(tokenizer):
    model = tiny(tokenizer)
    ds = ForgetRetainDataset(tokenizer, FORGET, RETAIN)
    with pytest.raises(ValueError, match="needs a reference"):
        train_model(model, B.get_method("npo")(fast_config("npo")), ds)
    with pytest.raises(ValueError, match="does not use a reference"):
        train_model(model, B.get_method("ga")(fast_config("ga")), ds, ref_model=tiny(tokenizer))
    with pytest.raises(ValueError, match="must be frozen"):
        train_model(model, B.get_method("npo")(fast_config("npo")), ds, ref_model=tiny(tokenizer))


def test_npo_trains_with_reference(tokenizer):
    model = tiny(tokenizer)
    before = mean_logp(model, tokenizer, FORGET)
    res = B.unlearn(model, tokenizer, FORGET, RETAIN, "npo", fast_config("npo", beta=0.5), progress=False)
    assert mean_logp(res.model, tokenizer, FORGET) < before
    assert res.final_logs["forget_logratio"] < 0


def test_gradient_accumulation_matches_big_batch(tokenizer):
    """One step with 4 micro-batches of 1 == one step with a batch of 4 (answers of different lengths).

    Adam with a huge eps makes the first update ~ lr * grad / eps, i.e. linear in the gradient, so a wrongly
    weighted accumulation would show up (plain Adam's first step only sees the gradient's sign)."""
    lengths = {len(encode_qa(tokenizer, r["question"], r["answer"]).labels) for r in FORGET}
    assert len(lengths) > 1  # otherwise the test could not tell token- from sequence-weighting
    start = tiny(tokenizer)
    deltas, losses = [], []
    for micro in (4, 1):
        model = tiny(tokenizer)
        cfg = fast_config("gd", num_epochs=1, effective_batch_size=4, micro_batch_size=micro, learning_rate=1.0,
                          adam_eps=1e3, max_grad_norm=None)
        res = B.unlearn(model, tokenizer, FORGET, RETAIN, "gd", cfg, seed=3, progress=False)
        assert res.optimizer_steps == 1 and res.gradient_accumulation_steps == 4 // micro
        deltas.append(torch.cat([(p - q).flatten() for p, q in zip(res.model.parameters(), start.parameters())]))
        losses.append(res.history[0]["loss"])
    assert deltas[0].abs().max() > 1e-5
    torch.testing.assert_close(deltas[1], deltas[0], rtol=1e-3, atol=1e-7)
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)  # the logged step loss is the big-batch loss


def test_deterministic_for_a_seed(tokenizer):
    outs = []
    for seed in (5, 5):
        res = B.unlearn(tiny(tokenizer), tokenizer, FORGET, RETAIN, "simnpo",
                        fast_config("simnpo", num_epochs=2, micro_batch_size=1), seed=seed, progress=False)
        outs.append(torch.cat([p.flatten() for p in res.model.parameters()]))
        outs.append(res.history)
    assert torch.equal(outs[0], outs[2]) and outs[1] == outs[3]


def test_resource_monitor_counts_trainable_only(tokenizer):
    model = tiny(tokenizer)
    model.get_input_embeddings().weight.requires_grad_(False)
    with B.ResourceMonitor("cpu", model=model) as mon:
        torch.ones(10).sum()
    r = mon.record
    emb = model.get_input_embeddings().weight.numel()
    assert r.total_params - r.trainable_params == emb
    assert r.peak_memory_bytes >= r.peak_memory_at_start_bytes > 0 and r.wall_time_s >= 0
    assert r.to_dict()["peak_memory_source"] == "process_peak_rss"


def test_a_warm_up_as_long_as_the_run_is_named(tokenizer, caplog):
    """RWKU's 20 warm-up steps on a short run: the learning rate never reaches its value, and the log says so."""
    config = fast_config("ga")
    config.warmup_steps = 50
    with caplog.at_level("WARNING"):
        B.unlearn(tiny(tokenizer), tokenizer, FORGET, RETAIN, "ga", config, progress=False)
    assert "warm-up (50 steps) covers all" in caplog.text and "never reaches" in caplog.text


def test_process_share_deals_a_step_out_and_keeps_every_process_in_the_sync():
    group = ["m0", "m1", "m2", "m3", "m4", "m5"]
    assert process_share(group, 0, 2) == [("m0", 1.0), ("m2", 1.0), ("m4", 1.0)]
    assert process_share(group, 1, 2) == [("m1", 1.0), ("m3", 1.0), ("m5", 1.0)]
    assert process_share(group, 0, 1) == [(m, 1.0) for m in group]
    # a last step shorter than the process count: the process left over computes at weight 0
    assert process_share(["m0"], 1, 2) == [("m0", 0.0)]
