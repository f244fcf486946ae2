"""Does the `cru` model's stop cut (`CRULM.dropped_stop_ids`) change the Original's RWKU answers?

On SmolLM2, RWKU's unknown-token stop resolves to `<|endoftext|>`, a special token the decoding drops; before the cut,
an answer went on past it while its batch ran. This generates the options_report_rwku_cpu Original's answers once
(target 2, 8 rows per task, batch 8, chat template) and decodes each with and without the cut.

    python benchmarks/rwku_stop_cut_check.py --data-dir ../shared/data/rwku
"""
from __future__ import annotations

import argparse
from pathlib import Path
from unittest.mock import patch

import lm_eval
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

from cru_harness.lmeval.model import CRULM
from cru_harness.benchmarks.rwku.tasks import utils as rwku_utils
from cru_harness.testbed.smollm import materialize_smollm2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="the RWKU folder of the shared data")
    parser.add_argument("--target", default="2")
    args = parser.parse_args()

    changed, total = [], 0
    cut_generate = CRULM._model_generate

    def both(self, context, max_length, stop, **kwargs):
        nonlocal total
        uncut = HFLM._model_generate(self, context, max_length, stop, **kwargs)
        with patch.object(HFLM, "_model_generate", lambda *a, **k: uncut):
            cut = cut_generate(self, context, max_length, stop, **kwargs)
        start = context.shape[1]
        for a, b in zip(uncut[:, start:].tolist(), cut[:, start:].tolist()):
            total += 1
            if self.tok_decode(a) != self.tok_decode(b):
                changed.append((self.tok_decode(a), self.tok_decode(b)))
        return cut

    with patch.object(CRULM, "_model_generate", both):
        lm = CRULM(base=str(materialize_smollm2()), device="cpu", batch_size=8)
        tasks = TaskManager(include_path=str(Path(rwku_utils.__file__).parent), include_defaults=False,
                            metadata={"data_dir": args.data_dir, "rwku_targets": args.target})
        lm_eval.simple_evaluate(model=lm, tasks=["rwku_forget", "rwku_neighbor", "rwku_utility_triviaqa"],
                                task_manager=tasks, limit=8, apply_chat_template=True)
    print(f"answers generated: {total}; changed by the cut: {len(changed)}")
    for uncut, cut in changed:
        print(f"  {uncut!r} -> {cut!r}")


if __name__ == "__main__":
    main()
