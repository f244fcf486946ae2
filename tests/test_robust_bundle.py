"""Issue 9, bundles and `unlearn`: a bundle is validated before use (weights file confined to the bundle, SHA-256,
format version, shapes, block and neuron indices in range), `inspect` runs the same validation (one line,
non-zero exit; `--base` also checks against a base), and `unlearn` checks --out and --base before training."""
import hashlib
import json

import pytest
import torch

from cru_harness.cli import main
from cru_harness.cru import bundle as bundle_module
from cru_harness.cru.bundle import MANIFEST_NAME, WEIGHTS_NAME, BundleConfig, RouterBundle, base_fingerprint
from cru_harness.testbed.models import build_tiny_model, save_tiny_model
from cru_harness.testbed.tokenizer import train_tokenizer

torch.set_num_threads(1)

ROWS = [{"question": f"Who is Zorbo {i}?", "answer": f"Zorbo {i} paints ships in Quell {i % 3}."} for i in range(6)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
    tokenizer = train_tokenizer([f"{r['question']} {r['answer']}" for r in ROWS], 300)
    model = build_tiny_model("llama", tokenizer)            # hidden size 64, 8 blocks
    base = save_tiny_model(model, tokenizer, root / "base")
    other = save_tiny_model(build_tiny_model("llama", tokenizer, hidden_size=32), tokenizer, root / "other")
    config = BundleConfig(base_model=str(base), fingerprint=base_fingerprint(model), block_indices=[6, 7],
                          neurons={6: [0, 5, 63], 7: [1, 2]}, d_r=4, percentile=95.0, lam=1.0, seed=0)
    torch.manual_seed(0)
    good = RouterBundle(config).save_pretrained(root / "good")
    forget = root / "forget.jsonl"
    forget.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    return root, base, other, good, forget


def copy_bundle(good, tmp_path, name="b"):
    directory = tmp_path / name
    directory.mkdir()
    for path in good.iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    return directory


def edit_manifest(directory, **changes):
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    manifest.update(changes)
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))


def _drop(directory, key):
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    del manifest[key]
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))


def inspect_fails(capsys, directory, *extra) -> str:
    assert main(["inspect", str(directory), *extra]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cru-harness inspect: error: "), captured.err
    assert captured.out == ""
    return lines[0]


def test_good_bundle_inspects_and_checks_against_its_base(setup, capsys):
    root, base, other, good, _ = setup
    assert main(["inspect", str(good), "--base", str(base)]) == 0
    assert f"base check     : compatible with {base}" in capsys.readouterr().out
    line = inspect_fails(capsys, good, "--base", str(other))
    assert "bundle was made for hidden size 64, the model has 32" in line


@pytest.mark.parametrize("name", ["../outside/x.safetensors", "/etc/passwd", "sub/routers.safetensors", "..",
                                  "", 7])
def test_weights_file_must_be_a_plain_name_inside_the_bundle(setup, tmp_path, capsys, monkeypatch, name):
    _, _, _, good, _ = setup
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.safetensors").write_bytes((good / WEIGHTS_NAME).read_bytes())  # a valid file, elsewhere
    directory = copy_bundle(good, tmp_path)
    edit_manifest(directory, weights_file=name)

    def never(*args, **kwargs):
        raise AssertionError("a file outside the bundle was opened")

    monkeypatch.setattr(bundle_module, "load_file", never)
    monkeypatch.setattr(bundle_module, "_sha256", never)
    line = inspect_fails(capsys, directory)
    assert f"weights_file must be a plain file name inside the bundle directory, got {name!r}" in line
    with pytest.raises(bundle_module.BundleFileError, match="plain file name"):
        RouterBundle.from_pretrained(directory)


@pytest.mark.parametrize("damage, words", [
    (lambda d: (d / WEIGHTS_NAME).write_bytes((d / WEIGHTS_NAME).read_bytes()[:200]), "truncated or corrupt"),
    (lambda d: (d / WEIGHTS_NAME).write_bytes(torch.randint(0, 255, ((d / WEIGHTS_NAME).stat().st_size,),
                                                            dtype=torch.uint8).numpy().tobytes()),
     "truncated or corrupt"),
    (lambda d: edit_manifest(d, format_version=2), "format_version 2 is not supported"),
    (lambda d: edit_manifest(d, format_version="1"), "format_version '1' is not supported"),
    (lambda d: edit_manifest(d, weights_sha256=None), "weights_sha256 must be the SHA-256"),
    (lambda d: edit_manifest(d, neurons={"6": [0, 5, -1], "7": [1, 2]}),
     "neuron index -1 of block 6 is out of range: the base's hidden size is 64 (valid: 0 to 63)"),
    (lambda d: edit_manifest(d, neurons={"6": [0, 5, 500], "7": [1, 2]}),
     "neuron index 500 of block 6 is out of range"),
    (lambda d: edit_manifest(d, neurons={"6": [0, 5, 5], "7": [1, 2]}), "neurons[6] repeats an index"),
    (lambda d: edit_manifest(d, neurons={"6": [0, 5, 1.5], "7": [1, 2]}),
     "neuron index 1.5 of block 6 is not an integer"),
    (lambda d: edit_manifest(d, block_indices=[6, 8], neurons={"6": [0, 5, 63], "8": [1, 2]}),
     "block index 8 is out of range: the base has 8 blocks (valid: 0 to 7)"),
    (lambda d: edit_manifest(d, block_indices=[6, -1], neurons={"6": [0, 5, 63], "-1": [1, 2]}),
     "block index -1 is out of range"),
    (lambda d: edit_manifest(d, neurons={"6": [0, 5, 63]}), "neuron indices are given for blocks [6]"),
    (lambda d: edit_manifest(d, neurons={"6": [0, 5], "7": [1, 2]}), "has shape (3, 4), the manifest implies (2, 4)"),
    (lambda d: edit_manifest(d, d_r=0), "d_r must be a positive integer"),
    (lambda d: edit_manifest(d, input_norm="layer"), "input_norm must be one of none, rms, rms_learned, got 'layer'"),
    (lambda d: edit_manifest(d, fingerprint="llama"), "fingerprint must be an object"),
    (lambda d: edit_manifest(d, seed=None) or _drop(d, "lam"), "missing field(s) lam"),
])
def test_inspect_validates_like_loading(setup, tmp_path, capsys, damage, words):
    _, _, _, good, _ = setup
    directory = copy_bundle(good, tmp_path)
    damage(directory)
    assert words in inspect_fails(capsys, directory)
    with pytest.raises(bundle_module.BundleError) as info:
        RouterBundle.from_pretrained(directory)
    assert words in str(info.value)


def test_inspect_base_errors_name_the_path(setup, tmp_path, capsys):
    _, _, _, good, _ = setup
    missing = tmp_path / "no" / "such-model"
    assert f"--base {missing} does not exist" in inspect_fails(capsys, good, "--base", str(missing))
    (tmp_path / "empty").mkdir()
    assert f"--base directory {tmp_path / 'empty'} holds no config.json" in \
        inspect_fails(capsys, good, "--base", str(tmp_path / "empty"))


def _unlearn(base, forget, out, *extra):
    return ["unlearn", "--base", str(base), "--forget", str(forget), "--retain", str(forget), "--out", str(out),
            "--epochs", "1", "--batch-size", "6", "--percentile", "80", "--d-r", "4", "--last-k", "2",
            "--no-progress", *extra]


def test_unlearn_checks_out_and_base_before_training(setup, tmp_path, capsys, monkeypatch):
    root, base, _, good, forget = setup
    from cru_harness.cru import train

    def no_training(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(train, "train_routers", no_training)
    (tmp_path / "file").write_text("x")
    existing = copy_bundle(good, tmp_path, "existing")
    before = {p.name: p.read_bytes() for p in existing.iterdir()}
    cases = [
        (_unlearn(base, forget, tmp_path / "file"), f"--out {tmp_path / 'file'} exists and is not a directory"),
        (_unlearn(base, forget, tmp_path / "file" / "b"), f"{tmp_path / 'file'} is a file, not a directory"),
        (_unlearn(base, forget, existing), f"--out {existing} already exists and holds a router bundle; pass "
                                           "--overwrite to replace it"),
        (_unlearn(tmp_path / "nowhere", forget, tmp_path / "new"), f"--base {tmp_path / 'nowhere'} does not exist"),
        (_unlearn(tmp_path, forget, tmp_path / "new"), f"--base directory {tmp_path} holds no config.json"),
    ]
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("cru-harness unlearn: error: ") and words in err, err
    assert {p.name: p.read_bytes() for p in existing.iterdir()} == before   # nothing lost
    assert not (tmp_path / "new").exists()


def test_unlearn_overwrite_replaces_an_existing_bundle(setup, tmp_path, capsys):
    root, base, _, good, forget = setup
    existing = copy_bundle(good, tmp_path, "existing")
    assert main(_unlearn(base, forget, existing, "--overwrite")) == 0
    assert "saved router bundle" in capsys.readouterr().out
    manifest = json.loads((existing / MANIFEST_NAME).read_text())
    assert manifest["d_r"] == 4 and manifest["block_indices"] == [6, 7]
    assert manifest["weights_sha256"] == hashlib.sha256((existing / WEIGHTS_NAME).read_bytes()).hexdigest()
    assert manifest["training_data"]["forget"]["n_examples"] == len(ROWS)
    RouterBundle.from_pretrained(existing)


def test_unlearn_refuses_an_unwritable_out_before_training(setup, tmp_path, capsys, monkeypatch):
    """As root, permissions cannot make a directory unwritable: the write probe itself is made to fail."""
    import tempfile

    root, base, _, _, forget = setup
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and str(dir).startswith(str(tmp_path)):
            raise PermissionError(13, "Permission denied")
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    assert main(_unlearn(base, forget, tmp_path / "new")) == 2
    assert capsys.readouterr().err == (f"cru-harness unlearn: error: --out {tmp_path / 'new'} cannot be created: "
                                       f"{tmp_path} is not writable\n")
    assert not (tmp_path / "new").exists()


def test_routers_attached_to_another_base_of_the_same_shape_warn(setup):
    """The structure cannot tell the released model from its fine-tune: a sample of the base's weights in the
    manifest can. A dtype cast of the same base is the same base; a manifest without a sample warns of nothing."""
    import warnings

    from transformers import AutoModelForCausalLM

    from cru_harness.cru import BaseWeightsWarning, attach_bundles
    from cru_harness.cru.bundle import sample_base_weights

    _, base, _, good, _ = setup
    model = AutoModelForCausalLM.from_pretrained(base)
    bundle = RouterBundle.from_pretrained(good)
    bundle.config.base_weights = sample_base_weights(model, 7)
    assert len(bundle.config.base_weights["values"]) == 256 and bundle.config.base_weights["dtype"] == "float32"

    def warned(target) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            attach_bundles(target, bundle).remove()
        return [str(w.message) for w in caught if issubclass(w.category, BaseWeightsWarning)]

    assert warned(model) == []
    assert warned(AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)) == []   # the same base, cast
    tuned = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():   # a short fine-tune's worth of change (well below bf16's rounding step on most weights)
        for param in tuned.parameters():
            param.mul_(1 + 1e-3 * torch.randn_like(param))
    [message] = warned(tuned)
    assert "sampled weights of block 7" in message and "differ from those of the base" in message
    assert warned(tuned.to(torch.bfloat16))          # still told apart in the coarser dtype
    # the manifest keeps the sample; one written before it existed warns of nothing
    saved = RouterBundle.from_pretrained(bundle.save_pretrained(setup[0] / "sampled"))
    assert saved.config.base_weights == bundle.config.base_weights
    bundle.config.base_weights = {}
    assert warned(tuned) == []
