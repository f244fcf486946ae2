"""`cru-harness unlearn` and `cru-harness inspect`, run in-process through `cru_harness.cli.main`."""
import json

import pytest
import torch

from cru_harness.cli import main
from cru_harness.cru import RouterBundle
from cru_harness.cru.bundle import MANIFEST_NAME
from cru_harness.testbed.models import build_tiny_model, save_tiny_model
from cru_harness.testbed.tokenizer import train_tokenizer

torch.set_num_threads(1)

FORGET_ROWS = [{"question": f"Who is Zorbo {i}?", "answer": f"Zorbo {i} paints ships in Quell {i % 3}."}
               for i in range(10)]
RETAIN_ROWS = [{"text": f"The capital of land {i} is city number {i * 3}."} for i in range(10)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    texts = [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in FORGET_ROWS] + \
            [r["text"] for r in RETAIN_ROWS]
    tokenizer = train_tokenizer(texts, 400)
    base = save_tiny_model(build_tiny_model("llama", tokenizer), tokenizer, root / "base")
    forget = root / "forget.jsonl"
    forget.write_text("\n".join(json.dumps(r) for r in FORGET_ROWS) + "\n")
    retain = root / "retain.json"
    retain.write_text(json.dumps(RETAIN_ROWS))
    return root, base, forget, retain


def _unlearn_args(base, forget, retain, out, *extra):
    return ["unlearn", "--base", str(base), "--forget", str(forget), "--retain", str(retain), "--out", str(out),
            "--epochs", "2", "--batch-size", "5", "--percentile", "80", "--lr", "1e-2", "--no-progress", *extra]


def test_unlearn_then_inspect(setup, capsys):
    root, base, forget, retain = setup
    out = root / "bundle"
    assert main(_unlearn_args(base, forget, retain, out, "--last-k", "3", "--d-r", "8", "--lambda", "2")) == 0
    assert "saved router bundle" in capsys.readouterr().out
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["block_indices"] == [5, 6, 7]
    assert manifest["d_r"] == 8 and manifest["lam"] == 2.0
    assert manifest["base_model"] == str(base)
    assert manifest["training_data"]["forget"]["n_examples"] == len(FORGET_ROWS)
    assert manifest["training_data"]["forget"]["description"] == str(forget)
    bundle = RouterBundle.from_pretrained(out)
    assert bundle.config.metrics["forget_gate_mean"] == manifest["metrics"]["forget_gate_mean"]

    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "blocks         : [5, 6, 7]" in text
    params = manifest["router_parameters"]
    assert f"router params  : {params:,}" in text
    ratio = 100.0 * params / manifest["base_parameters"]
    assert f"{ratio:.4f}% of the base's" in text
    assert "routers.safetensors" in text and "gate means" in text

    assert main(["inspect", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["d_r"] == 8


def test_unlearn_bad_inputs_are_plain_errors(setup, capsys):
    root, base, forget, retain = setup
    bad_rows = root / "bad.jsonl"
    bad_rows.write_text(json.dumps({"prompt": "no question or text here"}) + "\n")
    empty = root / "empty.jsonl"
    empty.write_text("")
    cases = [
        (_unlearn_args(base, bad_rows, retain, root / "x"), "neither"),
        (_unlearn_args(base, empty, retain, root / "x"), "empty"),
        (_unlearn_args(base, forget, retain, root / "x") + ["--percentile", "100"], "percentile"),
        (_unlearn_args(root / "no-such-model", forget, retain, root / "x"), "no-such-model"),
        # the seed rule of configs' `seeds` (runner.config.seed_problem), not accelerate's or numpy's traceback
        (_unlearn_args(base, forget, retain, root / "x") + ["--seed", "99999999999999999999999"],
         "--seed must be an integer from 0 to 2**32 - 1, got 99999999999999999999999"),
        (_unlearn_args(base, forget, retain, root / "x") + ["--seed", "-1"], "--seed must be an integer from 0"),
        (["inspect", str(root)], "cru_bundle.json is missing"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "error:" in err and message in err, err
        assert "Traceback" not in err
    assert not (root / "x").exists()


def test_only_the_projects_error_types_become_one_line(monkeypatch, capsys):
    """Bad input (an `InputError`, a `UserError`) is one line and exit 2; a plain ValueError, as a bug or a
    library raises it, keeps its traceback."""
    import cru_harness.cru.cli as cru_cli
    from cru_harness.errors import InputError, MissingInputError

    def raising(err):
        def run(args):
            raise err
        return run

    monkeypatch.setattr(cru_cli, "run_inspect", raising(ValueError("an internal invariant broke")))
    with pytest.raises(ValueError, match="invariant"):
        main(["inspect", "somewhere"])
    monkeypatch.setattr(cru_cli, "run_inspect", raising(FileNotFoundError("a file the code itself expected")))
    with pytest.raises(FileNotFoundError):
        main(["inspect", "somewhere"])
    capsys.readouterr()
    for err in (InputError("bad value\nsecond line"), MissingInputError("no such file: x")):
        monkeypatch.setattr(cru_cli, "run_inspect", raising(err))
        assert main(["inspect", "somewhere"]) == 2
        assert capsys.readouterr().err == f"cru-harness inspect: error: {' '.join(str(err).split(chr(10)))}\n"


def test_unlearn_out_of_gpu_memory_is_one_line_naming_what_to_lower(setup, monkeypatch, capsys):
    """CUDA's out-of-memory error in router training is one line with torch's sizes and the settings to lower."""
    import cru_harness.cru.train as cru_train

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 1 has a total "
                                          "capacity of 23.55 GiB of which 100.00 MiB is free.")

    monkeypatch.setattr(cru_train, "localize", out_of_memory)
    root, base, forget, retain = setup
    assert main(_unlearn_args(base, forget, retain, root / "oom")) == 2
    err = capsys.readouterr().err   # one line: --no-progress hides transformers' loading bar too
    assert err == ("cru-harness unlearn: error: CRU router training: CUDA out of memory (GPU 1: 512.00 MiB asked, "
                   "100.00 MiB of 23.55 GiB free); lower batch_size (--batch-size; a smaller batch trains other "
                   "routers) or max_length (--max-length), or load the frozen base in bfloat16 (--dtype bfloat16)\n")
    assert not (root / "oom").exists()


def test_unlearn_prompt_format_can_name_an_open_unlearning_model_config(setup, monkeypatch):
    """`--prompt-format Llama-2-7b-chat-hf`: QA rows are written in that config's tags (`[INST] q [/INST]a`), as
    the TOFU tasks score them under `tofu_model_family`; text rows stay as they are."""
    import cru_harness.cru.train as cru_train   # the command imports train_routers from here when it runs

    root, base, forget, retain = setup
    seen, real = {}, cru_train.train_routers

    def spy(model, tokenizer, forget_texts, retain_texts, config):
        seen["forget"], seen["retain"] = forget_texts, retain_texts
        return real(model, tokenizer, forget_texts, retain_texts, config)

    monkeypatch.setattr(cru_train, "train_routers", spy)
    assert main(_unlearn_args(base, forget, retain, root / "inst", "--prompt-format", "Llama-2-7b-chat-hf")) == 0
    row = FORGET_ROWS[0]
    assert seen["forget"][0] == f"[INST] {row['question']} [/INST]{row['answer']}"
    assert seen["retain"][0] == RETAIN_ROWS[0]["text"]


def test_unlearn_benchmark_rwku_writes_question_rows_as_rwku_asks_them(setup, monkeypatch, capsys):
    """`--benchmark rwku`: a question row is written as RWKU's QA probe asks it (its instruction line,
    `Answer:` before the answer), not in TOFU's format; a TOFU model config name is refused in one line, before
    any model is loaded."""
    import cru_harness.cru.train as cru_train

    root, base, forget, retain = setup
    seen, real = {}, cru_train.train_routers

    def spy(model, tokenizer, forget_texts, retain_texts, config):
        seen["forget"] = forget_texts
        return real(model, tokenizer, forget_texts, retain_texts, config)

    monkeypatch.setattr(cru_train, "train_routers", spy)
    assert main(_unlearn_args(base, forget, retain, root / "rwku", "--benchmark", "rwku", "--prompt-format",
                              "plain")) == 0
    row = FORGET_ROWS[0]
    assert seen["forget"][0] == (f"Please briefly answer the following question.\nQuestion: {row['question']}\n"
                                 f"Answer: {row['answer']}")
    # the paper's RWKU setting where a flag leaves it unset (lambda 50, d_r 256; --percentile 80 was given)
    manifest = json.loads((root / "rwku" / "cru_bundle.json").read_text())
    assert (manifest["lam"], manifest["d_r"], manifest["percentile"]) == (50, 256, 80)
    capsys.readouterr()
    argv = _unlearn_args(root / "no-such-model", forget, retain, root / "x", "--benchmark", "rwku",
                         "--prompt-format", "phi-1_5")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--prompt-format phi-1_5 names a TOFU model config" in err and "no-such-model" not in err
    assert not (root / "x").exists()


class _Stop(Exception):
    """Raised by a stand-in for training: the test has what it needed."""


def test_unlearn_takes_its_defaults_from_the_config_dataclass(setup, monkeypatch, capsys):
    """The flags copy no default: with RouterTrainingConfig's defaults changed, a command without the flags
    trains with the new ones and its help prints them; `--benchmark rwku` brings RWKU's setting, a flag wins."""
    import dataclasses
    import functools

    import cru_harness.cru.cli as cru_cli
    import cru_harness.cru.train as cru_train

    @dataclasses.dataclass
    class Changed(cru_train.RouterTrainingConfig):
        lr: float = 0.25
        epochs: int = 2
        gate_site: str = "mlp"

    seen = []

    def capture(model, tokenizer, forget, retain, config):
        seen.append(config)
        raise _Stop

    monkeypatch.setattr(cru_train, "RouterTrainingConfig", Changed)
    monkeypatch.setattr(cru_train, "train_routers", capture)
    # a fresh cache (help reads the defaults once), the module's own restored after the test
    monkeypatch.setattr(cru_cli, "unlearn_defaults", functools.cache(cru_cli.unlearn_defaults.__wrapped__))
    root, base, forget, retain = setup
    plain = ["unlearn", "--base", str(base), "--forget", str(forget), "--retain", str(retain), "--out",
             str(root / "never"), "--no-progress"]
    for argv in (plain, plain + ["--benchmark", "rwku"], plain + ["--benchmark", "rwku", "--lambda", "3"]):
        with pytest.raises(_Stop):
            main(argv)
    tofu, rwku, rwku_lam3 = seen
    assert (tofu.lr, tofu.epochs, tofu.gate_site, tofu.lam, tofu.percentile, tofu.d_r) == (0.25, 2, "mlp", 1.0, 95, 32)
    assert (rwku.lr, rwku.lam, rwku.percentile, rwku.d_r) == (0.25, 50, 90, 256)
    assert (rwku_lam3.lam, rwku_lam3.percentile) == (3.0, 90)

    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["unlearn", "--help"])
    text = " ".join(capsys.readouterr().out.split())   # argparse wraps lines
    for shown in ("the routers' learning rate (default 0.25)", "epochs over the forget set (default 2)",
                  "down projection) (default mlp)", "retain weight λ (default 1.0; 50 with --benchmark rwku or wmdp)",
                  "router bottleneck width (default 32; 256 with --benchmark rwku or wmdp)", "(default tofu; registered: "):
        assert shown in text, shown


def test_unlearn_method_trains_any_registered_trainer(setup, capsys):
    """`unlearn --method NPO --set ...`: the trainer's preset with the given overrides, saved to --out as a model;
    the record says what trained (NPO, the overridden beta) and the weights moved."""
    from transformers import AutoModelForCausalLM

    root, base, forget, retain = setup
    out = root / "npo"
    argv = ["unlearn", "--method", "npo", "--base", str(base), "--forget", str(forget), "--retain", str(retain),
            "--out", str(out), "--set", "beta=0.5", "--set", "lr=1e-3", "--set", "num_epochs=1",
            "--set", "effective_batch_size=5", "--set", "micro_batch_size=5", "--set", "warmup_epochs=0",
            "--seed", "3", "--no-progress"]
    assert main(argv) == 0
    assert "saved the NPO-unlearned model" in capsys.readouterr().out
    record = json.loads((out / "unlearn_record.json").read_text())
    assert record["method"] == "npo" and record["seed"] == 3
    assert record["config"]["beta"] == 0.5 and record["config"]["learning_rate"] == 1e-3
    assert record["n_forget"] == len(FORGET_ROWS) and record["optimizer_steps"] == 2
    before = AutoModelForCausalLM.from_pretrained(base).state_dict()
    after = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_unlearn_method_errors_are_one_line_before_any_training(setup, capsys):
    root, base, forget, retain = setup
    common = ["--base", str(base), "--forget", str(forget), "--retain", str(retain), "--out", str(root / "y")]
    cases = [
        (["unlearn", "--method", "NPOO", *common], "unknown method 'NPOO' (did you mean 'NPO'?)"),
        (["unlearn", "--method", "GA", *common, "--set", "alpha=1"], "GA has no retain term"),
        (["unlearn", "--method", "NPO", *common, "--set", "betta=1"], "not a hyperparameter of NPO (did you mean"),
        (["unlearn", "--method", "NPO", *common, "--lambda", "2"], "--lam: CRU's options"),
        (["unlearn", "--method", "NPO", *common, "--set", "beta"], "--set expects KEY=VALUE"),
        (["unlearn", "--method", "NPO", *common, "--set", "beta=0"], "beta"),
        (["unlearn", "--method", "ICU", *common], "ICU trains nothing"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "error:" in err and message in err and "Traceback" not in err, (argv, err)
    assert not (root / "y").exists()


def test_unlearn_and_inspect_take_the_testbed_names(setup, monkeypatch, capsys):
    """`zoo:llama:finetuned` and `testbed:world`, as runner configs take them: the model name resolves through the
    testbed zoo (stood in for by the fixture's tiny model), the world is the testbed's TOFU-schema world, and the
    bundle records the name it was given and the prompt format its routers trained on."""
    from cru_harness.testbed import zoo

    root, base, _, _ = setup
    asked = []

    def checkpoint(arch="llama", variant="finetuned", **_):
        asked.append((arch, variant))
        return base

    monkeypatch.setattr(zoo, "tiny_checkpoint", checkpoint)
    out = root / "bundle_testbed"
    assert main(["unlearn", "--base", "zoo:llama:finetuned", "--data-dir", "testbed:world", "--forget", "forget01",
                 "--retain", "retain99", "--out", str(out), "--epochs", "1", "--batch-size", "5", "--percentile",
                 "80", "--no-progress"]) == 0, capsys.readouterr().err
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert asked == [("llama", "finetuned")]
    assert manifest["base_model"] == "zoo:llama:finetuned"
    assert manifest["training_data"]["forget"]["n_examples"] > 0
    assert manifest["training"]["prompt_format"] == "plain"   # the fixture's tokenizer has no chat template
    assert main(["inspect", str(out), "--base", "zoo:llama"]) == 0
    assert "compatible with zoo:llama" in capsys.readouterr().out
    ga = root / "ga_testbed"   # another method through the same names
    assert main(["unlearn", "--method", "GA", "--base", "zoo:llama:finetuned", "--data-dir", "testbed:world",
                 "--forget", "forget01", "--retain", "retain99", "--out", str(ga), "--set", "num_epochs=1",
                 "--set", "effective_batch_size=4", "--set", "micro_batch_size=4", "--no-progress"]) == 0, \
        capsys.readouterr().err
    # unlearn, inspect, unlearn --method: each resolved the name
    assert asked == [("llama", "finetuned")] * 3 and (ga / "unlearn_record.json").is_file()


def test_unlearn_takes_the_readings_and_inspect_names_them(setup, capsys):
    """--token-scope / --localization-tokens / --block-output reach the bundle (cru.readings) and inspect names
    them (a default bundle's manifest has none of them: test_cru_readings); an answer scope over text rows (no prompt, no answer) is one line, before training."""
    root, base, forget, retain = setup
    qa_retain = root / "retain_qa.jsonl"
    qa_retain.write_text("\n".join(json.dumps({"question": f"Where is land {i}?", "answer": f"Land {i} is south."})
                                   for i in range(10)) + "\n")
    out = root / "bundle_readings"
    assert main(_unlearn_args(base, forget, qa_retain, out, "--token-scope", "answer", "--localization-tokens",
                              "content", "--block-output", "hf_hidden_states")) == 0
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert (manifest["token_scope"], manifest["localization_tokens"], manifest["block_output"]) == \
        ("answer", "content", "hf_hidden_states")
    assert manifest["answer_marker"]                      # what the gates find the answer by
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    assert "readings       : token_scope answer, localization_tokens content, block_output hf_hidden_states" in \
        capsys.readouterr().out
    assert main(_unlearn_args(base, forget, retain, root / "bad", "--token-scope", "answer")) == 2
    err = capsys.readouterr().err
    assert "no answer" in err and "Traceback" not in err
