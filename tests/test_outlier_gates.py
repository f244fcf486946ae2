"""benchmarks/outlier_gates.py: each selected coordinate's mean gate on first and on later real tokens, as the
full gate tensors of unpadded single-text forwards give them."""
import json
import subprocess
import sys

import torch

from conftest import REPO_ROOT, load_benchmark
from cru_support import FORGET, RETAIN, llama, tokenizer  # noqa: F401 (fixtures)

from cru_harness.cru import RouterTrainingConfig, attach_bundles, localize
from cru_harness.cru.localize import tokenize_texts
from cru_harness.cru.train import new_bundle
from cru_harness.studies.analyses import observe_gates

SCRIPT = REPO_ROOT / "benchmarks" / "outlier_gates.py"


def test_gates_per_coordinate_split_first_and_later_real_tokens(llama, tokenizer):
    loc = localize(llama, tokenizer, FORGET, last_k=2, percentile=80)
    bundle = new_bundle(llama, loc, RouterTrainingConfig(seed=1, percentile=80)).eval()
    texts = [text + " And more." * i for i, text in enumerate(RETAIN[:7])]   # batches of 3 pad to their longest
    recorder = observe_gates(llama, tokenizer, bundle, texts, load_benchmark("outlier_gates").CoordinateGates(),
                             batch_size=3, max_length=64)
    single = {block: [] for block in bundle.block_indices}
    for ids in tokenize_texts(tokenizer, texts, 64):
        handle = attach_bundles(llama, [bundle], observer=lambda b, _bundle, g: single[b].append(g[0].float()))
        try:
            with torch.no_grad():
                llama(input_ids=torch.tensor([ids]))
        finally:
            handle.remove()
    for block, gates in single.items():   # each (tokens, coordinates)
        first, later = recorder.means(block)
        assert first.shape == later.shape == (len(bundle.neuron_indices(block)),)
        torch.testing.assert_close(first, torch.stack([g[0] for g in gates]).mean(0), rtol=0, atol=1e-5)
        torch.testing.assert_close(later, torch.cat([g[1:] for g in gates]).mean(0), rtol=0, atol=1e-5)
        assert not torch.allclose(first, later, atol=1e-3)   # the first token's gates are not the rest's


def test_refuses_a_reference_without_excluded_coordinates(tmp_path):
    routers = tmp_path / "ref" / "work" / "routers"
    routers.mkdir(parents=True)
    (routers / "cru_bundle.json").write_text(json.dumps({"excluded": {}}))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--reference", str(tmp_path / "ref"), "--config", "x.yaml",
                           str(tmp_path), "--out", str(tmp_path / "out.md")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "excluded no coordinates" in proc.stderr
    assert not (tmp_path / "out.md").exists()
