"""Distribution through accelerate: the runner's `training:` block (validated, shown by --dry-run, launched), the
sharded engines' rules checked on the CPU, and FSDP / ZeRO-3 runs where accelerate can run them."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from safetensors.torch import load_file

import cru_harness.baselines as B
from cru_harness.devices import DeviceError
from cru_harness.runner import config as cfg
from cru_harness.training.engine import Engine, check_data_parallel, check_shardable, make_accelerator
from cru_harness.training.launch import LaunchSettings, launch

from test_baselines_training import FORGET, RETAIN, base_dir  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[1]


def minimal(tmp_path, **extra):
    raw = yaml.safe_load((REPO / "configs" / "ci_minimal.yaml").read_text())
    raw.update(output_dir=str(tmp_path / "out"), **extra)
    return raw


def test_the_training_block_is_validated_naming_its_key(tmp_path):
    config = cfg.validate_config(minimal(tmp_path, training={"engine": "fsdp", "num_processes": 8}))
    assert config.training == {"engine": "fsdp", "num_processes": 8, "config_file": None}
    assert cfg.validate_config(minimal(tmp_path)).training == {}
    for bad, match in [({"engine": "megatron"}, "training.engine"), ({"engine": "ddp", "num_processes": 0},
                       "num_processes"), ({"num_processes": 2}, "need an engine"), ({"engines": "ddp"}, "unknown"),
                       ("fsdp", "expected a mapping")]:
        with pytest.raises(cfg.ConfigError, match=match):
            cfg.validate_config(minimal(tmp_path, training=bad))


def test_dry_run_shows_how_each_training_cell_is_launched(capsys):
    from cru_harness.cli import main

    assert main(["run", str(REPO / "configs" / "paper_tofu_8b_8gpu.yaml"), "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    command = plan["training"]["command"]
    assert "accelerate.commands.launch --config_file" in command and "--num_processes 8" in command
    assert command.split("--config_file ")[1].split()[0].endswith("accelerate/fsdp.yaml")
    assert main(["run", str(REPO / "configs" / "paper_tofu_8b_1gpu.yaml"), "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert "training" not in plan
    trained = [c["trains"] for c in plan["cells"] if c["kind"] == "method" and "CRU" not in c["trains"]]
    assert trained and all("LoRA adapter (r 8, alpha 16, q_proj,v_proj)" in t for t in trained)


def test_every_engine_has_its_accelerate_config():
    for engine in ("ddp", "fsdp", "zero3"):
        path = Path(LaunchSettings(engine, 8).accelerate_config())
        assert path.is_file(), path
        shipped = yaml.safe_load(path.read_text())
        assert shipped["distributed_type"] == {"ddp": "MULTI_GPU", "fsdp": "FSDP", "zero3": "DEEPSPEED"}[engine]
        assert shipped["mixed_precision"] == "no"   # the run's --dtype sets the precision
    assert yaml.safe_load(Path(LaunchSettings("zero3", 8).accelerate_config()).read_text())[
        "deepspeed_config"]["zero_stage"] == 3


def fake_accelerator(kind, rank=0, n=2):
    return SimpleNamespace(distributed_type=SimpleNamespace(name=kind), process_index=rank, num_processes=n)


def test_sharded_engines_run_the_same_forward_passes_on_every_process():
    """Under FSDP / ZeRO-3 a forward pass is a collective: a step's 3 micro-batches over 2 processes give each
    process 2 passes, the second process's extra one a weight-0 stand-in; DDP leaves the count uneven."""
    group = ["a", "b", "c"]
    model = torch.nn.Linear(1, 1)
    shares = {kind: [Engine(model, None, accelerator=fake_accelerator(kind, rank))._share(group) for rank in (0, 1)]
              for kind in ("FSDP", "DEEPSPEED", "MULTI_CPU")}
    assert shares["FSDP"] == shares["DEEPSPEED"] == [[("a", 1.0), ("c", 1.0)], [("b", 1.0), ("a", 0.0)]]
    assert shares["MULTI_CPU"] == [[("a", 1.0), ("c", 1.0)], [("b", 1.0)]]


def test_what_sharding_cannot_train_is_refused_before_training():
    fsdp = fake_accelerator("FSDP")
    for name in ("lunar", "task_vector"):   # its own fit / a post-training edit of the whole weights
        with pytest.raises(DeviceError, match=f"{name} under FSDP"):
            check_shardable(B.get_method(name)(), fsdp)
    check_shardable(B.get_method("npo")(), fsdp)
    config = B.get_method("ga").Config()
    with pytest.raises(DeviceError, match="shards the model over the processes itself"):
        check_data_parallel(fake_accelerator("FSDP", n=1), config, device_map="auto")
    with pytest.raises(DeviceError, match="MEGATRON_LM"):
        check_data_parallel(fake_accelerator("MEGATRON_LM", n=1), config)


@pytest.mark.parametrize("variable, engine", [("ACCELERATE_USE_FSDP", "FSDP"),
                                              ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")])
def test_a_sharded_engine_on_the_cpu_is_one_line(monkeypatch, variable, engine):
    """accelerate's FSDP plugin refuses the CPU, and a DeepSpeed config silently falls back to data parallel
    there: both are refused up front, naming the engine."""
    monkeypatch.setenv(variable, "true")
    with pytest.raises(DeviceError, match=f"set up for {engine}.*no CPU"):
        make_accelerator(B.get_method("ga").Config(), device="cpu")


def fsdp_missing() -> str | None:
    """accelerate's own capability check: its FSDP plugin, as the shipped config sets it up (the weights read by
    one process and broadcast: sync_module_states), needs an accelerator device (CUDA, XPU, ...). On the CPU
    accelerate has no FSDP at all: told `cpu=True` it runs plain DDP, else one process each, whatever the config."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    try:
        FullyShardedDataParallelPlugin(sync_module_states=True)
    except RuntimeError as err:   # "There are currently no available devices found, must be one of ..."
        return f"accelerate cannot run FSDP on this machine: {err}"
    return None



def launched_vs_one_process(base_dir, tmp_path, settings, device):
    """NPO (a reference model) trained by `launch` under `settings` and in this process: (moved, apart)."""
    config = B.get_method("npo").Config(learning_rate=1e-2, num_epochs=2, warmup_epochs=0.0, effective_batch_size=4,
                                        micro_batch_size=1, lr_scheduler="constant")
    kwargs = dict(tokenizer=None, forget_rows=FORGET, retain_rows=RETAIN, method="npo", config=config.to_dict(),
                  seed=0, progress=False, device=device)
    launch(settings, "cru_harness.baselines.api:unlearn",
           dict(model_path_or_model=str(base_dir), out_dir=str(tmp_path / "launched"), **kwargs))
    B.unlearn(str(base_dir), out_dir=tmp_path / "one", **kwargs)
    start, one, many = (load_file(p / "model.safetensors") for p in (base_dir, tmp_path / "one",
                                                                     tmp_path / "launched"))
    one_record = json.loads((tmp_path / "one" / "unlearn_record.json").read_text())
    many_record = json.loads((tmp_path / "launched" / "unlearn_record.json").read_text())
    assert many_record["num_processes"] == settings.num_processes and one_record["num_processes"] == 1
    assert [h["loss"] for h in many_record["history"]] == pytest.approx([h["loss"] for h in one_record["history"]],
                                                                        rel=1e-4)
    moved = max((one[k] - start[k]).abs().max().item() for k in start)
    apart = max((one[k] - many[k]).abs().max().item() for k in start)
    return moved, apart


@pytest.mark.slow
def test_a_launched_ddp_run_trains_as_one_process(base_dir, tmp_path):
    """The runner's launch path (`training: {engine: ddp, num_processes: 2}`) on 2 CPU processes (gloo): NPO with
    its reference gives one process's weights (within float reordering: 1e-3 of how far training moved them)."""
    moved, apart = launched_vs_one_process(base_dir, tmp_path, LaunchSettings("ddp", 2), "auto")
    assert moved > 1e-3 and apart <= 1e-3 * moved, (moved, apart)


@pytest.mark.slow
def test_fsdp_on_two_cpu_processes_trains_as_one(base_dir, tmp_path):
    """FSDP (full sharding) on 2 processes with the gloo backend equals one process within 1e-3 of the distance
    training moved the weights. accelerate's FSDP plugin refuses a machine without an accelerator device; then
    this skips with accelerate's reason and `test_fsdp_and_zero3_on_one_gpu_train_as_one_process` covers FSDP."""
    if reason := fsdp_missing():
        pytest.skip(reason)
    config = tmp_path / "fsdp.yaml"
    shipped = yaml.safe_load(Path(LaunchSettings("fsdp", 2).accelerate_config()).read_text())
    config.write_text(yaml.safe_dump({**shipped, "num_processes": 2}))
    moved, apart = launched_vs_one_process(base_dir, tmp_path, LaunchSettings("fsdp", 2, str(config)), "auto")
    assert moved > 1e-3 and apart <= 1e-3 * moved, (moved, apart)


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["fsdp", "zero3"])
def test_fsdp_and_zero3_on_one_gpu_train_as_one_process(base_dir, tmp_path, engine):
    """FSDP and DeepSpeed ZeRO-3 through accelerate launch on one GPU: NPO (its reference sharded too) gives the
    weights of the plain single-process run, within 1e-3 of how far training moved them."""
    if engine == "zero3":
        pytest.importorskip("deepspeed", reason="ZeRO-3 needs `pip install deepspeed`")
    config = tmp_path / f"{engine}.yaml"
    shipped = yaml.safe_load(Path(LaunchSettings(engine, 1).accelerate_config()).read_text())
    config.write_text(yaml.safe_dump({**shipped, "num_processes": 1}))
    moved, apart = launched_vs_one_process(base_dir, tmp_path, LaunchSettings(engine, 1, str(config)), "cuda")
    assert moved > 1e-3 and apart <= 1e-3 * moved, (moved, apart)


def test_under_a_sharded_engine_the_checkpoint_loads_into_host_memory(monkeypatch):
    """FSDP / ZeRO-3 place each process's shard on its GPU when the model is prepared: loading the whole fp32
    model onto every GPU first would need the memory sharding saves."""
    import cru_harness.training.engine as engine

    seen = []
    monkeypatch.setattr(engine, "load_causal_lm", lambda path, **kw: seen.append(kw["device"]) or
                        (torch.nn.Linear(1, 1), None))
    for kind, expected in (("FSDP", "cpu"), ("DEEPSPEED", "cpu"), ("MULTI_GPU", torch.device("cuda", 1))):
        accelerator = SimpleNamespace(device=torch.device("cuda", 1), distributed_type=SimpleNamespace(name=kind))
        engine.load_trainee("m", accelerator, dtype="bfloat16", device="auto")
        assert seen[-1] == expected, kind


def test_a_method_entrys_lora_is_validated_and_enters_the_cell_hash(tmp_path):
    from cru_harness.runner.plan import build_plan

    def ga_cell(**lora):
        raw = minimal(tmp_path)
        raw["methods"] = [{"method": "GA", "learning_rate": 1e-4, **lora}]
        config = cfg.validate_config(raw)
        return next(c for c in build_plan(config) if c.kind == "method")

    plain, adapter = ga_cell(), ga_cell(lora={"preset": "rwku"})
    assert "lora" not in plain.hparams and adapter.hparams["lora"] == {"preset": "rwku"}
    assert plain.hash != adapter.hash
    with pytest.raises(cfg.ConfigError, match=r"methods\[0\].*lora.r"):
        ga_cell(lora={"r": 0})
