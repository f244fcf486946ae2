"""benchmarks/hold_gates_open.py: a bundle with coordinates held open gates every other coordinate as before (to
float32 rounding) and leaves the held ones as the base computes them; the control draws other selected ones."""
import subprocess
import sys

import pytest
import torch

from conftest import REPO_ROOT, load_benchmark
from cru_support import FORGET, llama, tokenizer  # noqa: F401 (fixtures)

from cru_harness.cru import RouterBundle, RouterTrainingConfig, attach_bundles, find_decoder_blocks, localize
from cru_harness.cru.train import new_bundle

SCRIPT = REPO_ROOT / "benchmarks" / "hold_gates_open.py"


def test_held_coordinates_are_ungated_and_the_others_unchanged(llama, tokenizer, tmp_path):
    script = load_benchmark("hold_gates_open")
    loc = localize(llama, tokenizer, FORGET, last_k=2, percentile=80)
    bundle = new_bundle(llama, loc, RouterTrainingConfig(seed=1, percentile=80)).eval()
    first = bundle.block_indices[0]
    chosen = bundle.neuron_indices(first).tolist()[:2]
    held, control = script.held_sets(bundle, set(chosen), seed=0)
    assert held[first] == set(chosen)
    for block in bundle.block_indices:
        selected = set(bundle.neuron_indices(block).tolist())
        assert len(control[block]) == len(held[block]) and control[block] <= selected - set(chosen)
    assert script.held_sets(bundle, set(chosen), seed=0)[1] == control   # seeded

    changed = script.without_coordinates(bundle, held)
    changed.save_pretrained(tmp_path / "routers")
    changed = RouterBundle.from_pretrained(tmp_path / "routers").eval()
    assert sorted(changed.neuron_indices(first).tolist()) == sorted(set(bundle.neuron_indices(first).tolist())
                                                                    - set(chosen))
    # the block's gates: the original's with the held columns dropped (to float32 rounding: a matmul of other
    # shape may sum in another order)
    ids = torch.tensor([tokenizer(FORGET[0])["input_ids"]])
    gates = {}
    for name, b in (("old", bundle), ("new", changed)):
        handle = attach_bundles(llama, [b], observer=lambda i, _b, g, name=name: gates.setdefault((name, i), g))
        with torch.no_grad():
            llama(input_ids=ids)
        handle.remove()
    keep = [i for i, c in enumerate(bundle.neuron_indices(first).tolist()) if c not in chosen]
    torch.testing.assert_close(gates[("new", first)], gates[("old", first)][..., keep], rtol=0, atol=1e-6)
    # at the first gated block's output: held coordinates as the base gives them, the others as the old bundle
    _, blocks = find_decoder_blocks(llama)
    outputs = {}
    for name, b in (("base", None), ("old", bundle), ("new", changed)):
        handle = attach_bundles(llama, [b]) if b is not None else None
        hook = blocks[first].register_forward_hook(   # after the gating hook: sees the gated output
            lambda _m, _a, out, name=name: outputs.__setitem__(name, out[0] if isinstance(out, tuple) else out))
        with torch.no_grad():
            llama(input_ids=ids)
        hook.remove()
        if handle is not None:
            handle.remove()
    others = [c for c in range(outputs["base"].shape[-1]) if c not in chosen]
    torch.testing.assert_close(outputs["new"][..., chosen], outputs["base"][..., chosen], rtol=0, atol=0)
    torch.testing.assert_close(outputs["new"][..., others], outputs["old"][..., others], rtol=0, atol=1e-5)
    assert not torch.equal(outputs["old"][..., chosen], outputs["base"][..., chosen])   # the gates did act there


def test_per_block_sets_hold_each_blocks_own(llama, tokenizer):
    loc = localize(llama, tokenizer, FORGET, last_k=2, percentile=80)
    bundle = new_bundle(llama, loc, RouterTrainingConfig(seed=1, percentile=80))
    first, second = bundle.block_indices
    a, b = bundle.neuron_indices(first).tolist()[0], bundle.neuron_indices(second).tolist()[-1]
    held, control = load_benchmark("hold_gates_open").held_sets(bundle, {first: {a}, second: {b}}, seed=3)
    assert held == {first: {a}, second: {b}}
    assert a not in control[first] and b not in control[second] and all(len(c) == 1 for c in control.values())


def test_holding_every_coordinate_open_is_refused(llama, tokenizer):
    script = load_benchmark("hold_gates_open")
    loc = localize(llama, tokenizer, FORGET, last_k=1, percentile=80)
    bundle = new_bundle(llama, loc, RouterTrainingConfig(seed=1, percentile=80))
    every = {b: set(bundle.neuron_indices(b).tolist()) for b in bundle.block_indices}
    with pytest.raises(ValueError, match="no gated coordinate"):
        script.without_coordinates(bundle, every)


def test_bad_hold_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--config", "x.yaml", "--labels", "CRU", "--hold", "17,a",
                           str(tmp_path), "--out", str(tmp_path / "out.md")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "comma-separated integers" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out.md").exists()


def test_hold_top_needs_a_reference(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--config", "x.yaml", "--labels", "CRU", "--hold", "top",
                           str(tmp_path), "--out", str(tmp_path / "out.md")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "--hold top needs --reference" in proc.stderr
