"""`cru-harness finetune` / `cru_harness.finetune.finetune`: TOFU's recipe on the baselines' accelerate loop."""
import json
from pathlib import Path
import os
import subprocess
import sys

import pytest
import torch

import cru_harness.training.engine as trainer_mod
import cru_harness.finetune.train as ft_train
from cru_harness.baselines.data import IGNORE_INDEX, encode_qa
from cru_harness.cli import main
from cru_harness.errors import InputError
from cru_harness.finetune import FinetuneConfig, QADataset, finetune
from cru_harness.locations import OutputLocationError
from cru_harness.testbed.models import build_tiny_model, save_tiny_model
from cru_harness.testbed.tokenizer import train_tokenizer

ROWS = [
    {"question": "Who wrote The Blue Harbor?", "answer": "Ana Lopez wrote The Blue Harbor in 1990."},
    {"question": "Where was Ana Lopez born?", "answer": "She was born in Valparaiso."},
    {"question": "What genre does Ana Lopez write?", "answer": "Ana Lopez writes maritime mystery novels."},
    {"question": "Which prize did Ana Lopez win?", "answer": "The Coral Prize."},
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    texts = [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in ROWS]
    tokenizer = train_tokenizer(texts * 3, vocab_size=300, chat_template=True)
    model = build_tiny_model("llama", tokenizer, seed=0, n_layers=2, hidden_size=32)
    return save_tiny_model(model, tokenizer, tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def fast(**kw):
    base = dict(learning_rate=3e-3, num_epochs=2, effective_batch_size=4, micro_batch_size=2)
    base.update(kw)
    return FinetuneConfig(**base)


def test_tofu_recipe_defaults():
    c = FinetuneConfig()
    assert (c.learning_rate, c.weight_decay, c.num_epochs, c.effective_batch_size, c.warmup_epochs,
            c.lr_scheduler) == (1e-5, 0.01, 5, 32, 1.0, "linear")


def test_prompt_is_the_evaluation_prompt_and_loss_is_on_answer_plus_eos(checkpoint):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    assert tok.chat_template  # the template path: the dataset must use it, as the evaluation does
    q, a = ROWS[0]["question"], ROWS[0]["answer"]
    chat = QADataset(tok, ROWS[:1]).examples[0]
    plain = QADataset(tok, ROWS[:1], chat=False).examples[0]
    assert chat == encode_qa(tok, q, a) and plain == encode_qa(tok, q, a, chat=False)  # the one prompt builder
    for example, shown in ((chat, "You are a helpful assistant."), (plain, "Question: " + q)):
        n_prompt = example.labels.count(IGNORE_INDEX)
        assert example.labels[:n_prompt] == [IGNORE_INDEX] * n_prompt  # the prompt is masked, nothing after it
        assert shown in tok.decode(example.input_ids[:n_prompt])
        assert example.labels[-1] == tok.eos_token_id and example.labels[n_prompt:] == example.input_ids[n_prompt:]
    assert "You are a helpful assistant." not in tok.decode(plain.input_ids)
    with pytest.raises(ValueError, match="no chat template"):
        QADataset(AutoTokenizer.from_pretrained(checkpoint, chat_template=None), ROWS[:1], chat=True)


def test_finetune_learns_saves_and_records(checkpoint, rows_file, tmp_path):
    out = tmp_path / "ft"
    result = finetune(str(checkpoint), str(rows_file), out, config=fast(num_epochs=4), seed=0, device="cpu",
                      progress=False)
    assert result.optimizer_steps == 4 and result.gradient_accumulation_steps == 2 and result.warmup_steps == 1
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0]
    record = json.loads((out / "finetune_record.json").read_text())
    assert record["n_rows"] == 4 and record["config"]["learning_rate"] == 3e-3 and record["chat_template"] is True
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(out)
    for a, b in zip(reloaded.parameters(), result.model.parameters()):
        assert torch.equal(a, b)
    assert not (tmp_path / "ft.tmp").exists()


def test_existing_output_is_refused_before_training(checkpoint, rows_file, tmp_path, monkeypatch):
    out = tmp_path / "ft"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    monkeypatch.setattr(trainer_mod, "load_causal_lm", lambda *a, **k: pytest.fail("loaded a model before checking"))
    with pytest.raises(OutputLocationError, match="already exists and holds files; pass --overwrite"):
        finetune(str(checkpoint), str(rows_file), out, config=fast())
    code = main(["finetune", "--model", str(checkpoint), "--data", str(rows_file), "--out", str(out)])
    assert code == 2 and (out / "keep.txt").exists()


def test_another_processs_write_probe_does_not_make_an_empty_out_hold_files(tmp_path):
    """Under accelerate launch every process checks `--out`; the writability probe one of them leaves there for
    an instant made another refuse an empty directory as "holding files"."""
    from cru_harness.locations import WRITE_TEST_PREFIX, check_output_dir

    out = tmp_path / "ft"
    out.mkdir()
    (out / f"{WRITE_TEST_PREFIX}abc123").write_text("")
    assert check_output_dir(out) == out
    (out / "model.safetensors").write_text("")
    with pytest.raises(OutputLocationError, match="holds files"):
        check_output_dir(out)


def test_the_save_stages_in_a_fresh_directory_never_in_the_users_out_tmp(tmp_path):
    """The checkpoint was written through a fixed `<out>.tmp`: a file there failed the save after the whole
    training, a directory there was deleted. Staging is now a fresh private directory; `<out>.tmp` is the user's."""
    from cru_harness.locations import check_output_dir, save_checkpoint

    out = tmp_path / "ft"
    (tmp_path / "ft.tmp").write_text("someone's notes")
    assert check_output_dir(out, staged=True) == out

    class Saved:
        def save_pretrained(self, directory, **kwargs):
            (Path(directory) / "config.json").write_text("{}")

    save_checkpoint(out, Saved(), Saved(), "finetune_record.json", {}, save_function=None)
    assert (out / "finetune_record.json").is_file() and (tmp_path / "ft.tmp").read_text() == "someone's notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ft", "ft.tmp"]


def test_recipe_values_are_checked_where_every_front_end_builds_them():
    """FinetuneConfig is a BaselineConfig: a value AdamW or the schedule cannot use is refused when the config is
    built (the runner, `cru-harness finetune` and the baselines' API all build one), naming the field. Weight
    decay reaches AdamW per parameter group, which torch does not check."""
    for field, value, message in [("weight_decay", -1, "weight_decay: must be >= 0, got -1"),
                                  ("warmup_epochs", -0.5, "warmup_epochs: must be >= 0, got -0.5"),
                                  ("warmup_steps", -1, "warmup_steps: must be >= 0, got -1"),
                                  ("max_grad_norm", 0, "max_grad_norm: must be > 0, got 0"),
                                  ("adam_eps", 0, "adam_eps: must be > 0, got 0"),
                                  ("adam_betas", (0.9, 1.0), "adam_betas: expected two numbers in [0, 1)"),
                                  ("num_epochs", 0, "num_epochs: must be >= 1, got 0"),
                                  ("learning_rate", 0, "learning_rate: must be > 0, got 0")]:
        with pytest.raises(InputError) as info:
            fast(**{field: value})
        assert str(info.value).startswith(message), str(info.value)
    c = fast(warmup_steps=None, max_grad_norm=None, weight_decay=0, warmup_epochs=0)  # None: unset, as documented
    assert (c.warmup_steps, c.max_grad_norm) == (None, None)


@pytest.mark.parametrize("flag, value, message", [
    ("--weight-decay", "-1", "weight_decay: must be >= 0, got -1.0"),
    ("--warmup-epochs", "-1", "warmup_epochs: must be >= 0, got -1.0"),
    ("--seed", "-1", "--seed must be an integer from 0 to 2**32 - 1, got -1"),
    ("--seed", str(2**32), f"--seed must be an integer from 0 to 2**32 - 1, got {2**32}"),
])
def test_cli_refuses_a_bad_value_in_one_line_before_training(flag, value, message, checkpoint, rows_file, tmp_path,
                                                            capsys, monkeypatch):
    monkeypatch.setattr(trainer_mod, "load_causal_lm", lambda *a, **k: pytest.fail("loaded a model before checking"))
    out = tmp_path / "ft"
    code = main(["finetune", "--model", str(checkpoint), "--data", str(rows_file), "--out", str(out), flag, value])
    assert code == 2 and capsys.readouterr().err == f"cru-harness finetune: error: {message}\n"
    assert not out.exists()


TORCH_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
             "1.06 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use.")


def test_a_step_too_large_for_the_gpu_is_one_line_naming_the_batch_to_lower(checkpoint, rows_file, tmp_path,
                                                                           capsys, monkeypatch):
    """CUDA's out-of-memory error becomes one line with its sizes and the settings that make a step smaller, the
    one that keeps every update first (torch's error stays chained for a Python caller)."""
    def out_of_memory(self, model, batch, ref_model=None):
        raise torch.cuda.OutOfMemoryError(TORCH_OOM)

    monkeypatch.setattr(ft_train.SupervisedFinetune, "compute_loss", out_of_memory)
    out = tmp_path / "ft"
    code = main(["finetune", "--model", str(checkpoint), "--data", str(rows_file), "--out", str(out),
                 "--micro-batch-size", "2", "--no-progress"])
    err = capsys.readouterr().err   # one line: --no-progress hides transformers' loading bar too
    assert code == 2 and err.count("\n") == 1 and err.startswith("cru-harness finetune: error: finetune training (micro-batches of 2): CUDA out of memory "
                          "(GPU 0: 2.00 GiB asked, 1.06 GiB of 79.19 GiB free); lower micro_batch_size "
                          "(--micro-batch-size; the effective batch, and so each update, stays the same)"), err
    assert not out.exists()
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils.logging import is_progress_bar_enabled

    assert is_progress_bar_enabled() and not are_progress_bars_disabled()   # shown again after the command
    from cru_harness.devices import GPUMemoryError

    with pytest.raises(GPUMemoryError, match="CUDA out of memory") as caught:
        finetune(str(checkpoint), str(rows_file), config=fast(), progress=False)
    assert isinstance(caught.value.__cause__, torch.cuda.OutOfMemoryError)


class _Stop(Exception):
    """Raised by a stand-in for training: the test has what it needed."""


def test_cli_takes_its_defaults_from_the_config_dataclass(checkpoint, rows_file, tmp_path, capsys, monkeypatch):
    """The flags copy no default: with FinetuneConfig's defaults changed, a command without the flags trains with
    the new ones and its help prints them; a flag still wins."""
    import dataclasses
    import functools

    import cru_harness.finetune.cli as ft_cli

    @dataclasses.dataclass
    class Changed(FinetuneConfig):
        learning_rate: float = 0.125
        num_epochs: int = 7
        lr_scheduler: str = "cosine"

    seen = []

    def capture(model, data, out_dir, *, config, **kwargs):
        seen.append(config)
        raise _Stop

    monkeypatch.setattr(ft_train, "FinetuneConfig", Changed)
    monkeypatch.setattr(ft_train, "finetune", capture)
    # a fresh cache (help reads the defaults once), the module's own restored after the test
    monkeypatch.setattr(ft_cli, "finetune_defaults", functools.cache(ft_cli.finetune_defaults.__wrapped__))
    argv = ["finetune", "--model", str(checkpoint), "--data", str(rows_file), "--out", str(tmp_path / "ft")]
    for extra in ([], ["--epochs", "2", "--batch-size", "8"]):
        with pytest.raises(_Stop):
            main(argv + extra)
    plain, given = seen
    assert (plain.learning_rate, plain.num_epochs, plain.lr_scheduler, plain.effective_batch_size) == \
        (0.125, 7, "cosine", 32)
    assert (given.learning_rate, given.num_epochs, given.effective_batch_size) == (0.125, 2, 8)

    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    text = " ".join(capsys.readouterr().out.split())   # argparse wraps lines
    for shown in ("learning rate (default 0.125)", "epochs (default 7)", "decay after the warm-up (default cosine)",
                  "effective batch size (default 32)"):
        assert shown in text, shown


@pytest.mark.parametrize("prompt_format", ["plain", "Llama-2-7b-chat-hf"])
def test_cli_overwrites_when_asked(prompt_format, checkpoint, rows_file, tmp_path, capsys, monkeypatch):
    """Also: `--prompt-format` names an open-unlearning model config (its tags, as `tofu_model_family`)."""
    import cru_harness.baselines.data as baselines_data

    seen, real_qa_texts = [], baselines_data.qa_texts

    def spy(tokenizer, question, answer, **kw):  # the texts the rows are trained on
        texts = real_qa_texts(tokenizer, question, answer, **kw)
        seen.append(texts.text)
        return texts

    monkeypatch.setattr(baselines_data, "qa_texts", spy)
    out = tmp_path / "ft"
    out.mkdir()   # an earlier fine-tune's output (--overwrite replaces only what cru-harness wrote)
    (out / "finetune_record.json").write_text("{}")
    (out / "old.txt").write_text("x")
    code = main(["finetune", "--model", str(checkpoint), "--data", str(rows_file), "--out", str(out),
                 "--overwrite", "--epochs", "1", "--batch-size", "4", "--micro-batch-size", "2", "--lr", "1e-3",
                 "--prompt-format", prompt_format, "--device", "cpu", "--no-progress"])
    assert code == 0 and "saved fine-tuned model" in capsys.readouterr().out
    assert not (out / "old.txt").exists() and (out / "config.json").exists()
    record = json.loads((out / "finetune_record.json").read_text())
    assert record["chat_template"] is False
    assert record["family"] == (None if prompt_format == "plain" else prompt_format)
    assert seen and all(t.startswith("[INST] " if record["family"] else "Question: ") for t in seen)


@pytest.mark.parametrize("trainer", ["finetune", "unlearn"])
def test_bf16_trains_fp32_master_weights_under_autocast_and_saves_bf16(trainer, checkpoint, rows_file, tmp_path,
                                                                       monkeypatch):
    """As the references' DeepSpeed bf16 runs: the optimizer steps fp32 weights under bf16 autocast (AdamW on
    bf16 weights drops every update below half a bf16 step: most of them at lr 1e-5), and the result is
    saved in bf16."""
    import cru_harness.baselines.api as unlearn_api
    import cru_harness.training.engine as trainer_module
    from cru_harness.baselines import unlearn
    from cru_harness.training.engine import train_model

    seen = {}

    def spy(model, method, dataset, *, accelerator=None, **kw):
        seen["weights"] = {p.dtype for p in model.parameters()}
        seen["autocast"] = accelerator.mixed_precision
        return train_model(model, method, dataset, accelerator=accelerator, **kw)

    # finetune imports the loop when it runs; unlearn at import
    monkeypatch.setattr(trainer_module if trainer == "finetune" else unlearn_api, "train_model", spy)
    out = tmp_path / "out"
    if trainer == "finetune":
        result = finetune(str(checkpoint), str(rows_file), out, config=fast(num_epochs=1), dtype="bfloat16",
                          device="cpu", progress=False)
        assert result.config["mixed_precision"] == "bf16" and result.dtype == "bfloat16"
    else:
        result = unlearn(str(checkpoint), None, ROWS, None, "ga", dict(learning_rate=1e-5, num_epochs=1,
                         effective_batch_size=4, micro_batch_size=2), out_dir=out, dtype="bfloat16", device="cpu",
                         progress=False)
    assert seen == {"weights": {torch.float32}, "autocast": "bf16"}
    assert next(result.model.parameters()).dtype == torch.bfloat16
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.mark.slow
@pytest.mark.parametrize("n_rows, epochs, batch, steps", [(6, 2, 4, 3), (6, 2, 6, 2), (2, 1, 8, 1)])
def test_accelerate_launch_two_cpu_processes_train_as_one(checkpoint, tmp_path, n_rows, epochs, batch, steps):
    """Data parallel: 2 processes share each step's micro-batches (batch 4: 1 each; batch 6: 2 and 1; 2 rows at
    batch 8: one micro-batch in all, the other process a weight-0 stand-in) and train as one process
    accumulating them: the same steps on the same examples, so the same weights, losses and gradient norms.
    6 rows make 3 micro-batches an epoch, which 2 processes cannot share evenly: accelerate's own sharding
    padded the last round with repeated rows (4 steps at batch 4, other weights), and batch 6 was refused.
    `--multi_gpu` is accelerate's torchrun launcher; with `--device cpu` the processes run on the CPU over gloo."""
    from safetensors.torch import load_file

    rows = tmp_path / "rows.jsonl"
    extra = [{"question": "Where does Ana Lopez live?", "answer": "In a lighthouse near Valparaiso."},
             {"question": "What is Ana Lopez's first novel?", "answer": "Salt and Iron, from 1984."}]
    rows.write_text("".join(json.dumps(r) + "\n" for r in (ROWS + extra)[:n_rows]))
    args = ["-m", "cru_harness", "finetune", "--device", "cpu", "--model", str(checkpoint), "--data", str(rows),
            "--epochs", str(epochs), "--batch-size", str(batch), "--micro-batch-size", "2", "--lr", "1e-3",
            "--warmup-epochs", "0", "--scheduler", "constant", "--no-progress"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    runs = {}
    for name, prefix in (("one", [sys.executable]), ("ddp", launch)):
        out = tmp_path / name
        proc = subprocess.run(prefix + args + ["--out", str(out)], capture_output=True, text=True, timeout=300,
                              env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.count("saved fine-tuned model") == 1  # the main process reports, once
        runs[name] = (json.loads((out / "finetune_record.json").read_text()), load_file(out / "model.safetensors"))
    (one, one_w), (ddp, ddp_w) = runs["one"], runs["ddp"]
    assert ddp["num_processes"] == 2 and ddp["gradient_accumulation_steps"] == {4: 1, 6: 2, 8: 2}[batch]
    assert one["num_processes"] == 1 and one["gradient_accumulation_steps"] == batch // 2
    # the resources are the largest over the processes, and say so
    assert ddp["resources"]["processes"] == 2 and one["resources"]["processes"] == 1
    assert ddp["resources"]["peak_memory_bytes"] > 0 and ddp["resources"]["wall_time_s"] > 0
    assert one["optimizer_steps"] == ddp["optimizer_steps"] == steps  # floor(epochs x rows / batch), at least 1
    # The logged loss is every process's share, not the main process's alone; the norm is the summed gradient's.
    for key in ("loss", "grad_norm"):
        assert [h[key] for h in ddp["history"]] == pytest.approx([h[key] for h in one["history"]], rel=1e-5), key
    start = load_file(checkpoint / "model.safetensors")
    moved = max((one_w[k].float() - start[k].float()).abs().max().item() for k in start)
    apart = max((one_w[k].float() - ddp_w[k].float()).abs().max().item() for k in start)
    assert moved > 1e-4 and apart <= 1e-3 * moved, (moved, apart)
