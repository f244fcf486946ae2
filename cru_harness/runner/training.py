"""The training phase of the runner's own cells: a retain oracle fine-tuned from the cell's base, or a model
fine-tuned with TOFU's recipe (`finetune:`). A method cell trains through its method plugin (`Method.run`,
`runner.execute`). Each trainer returns the path the evaluation loads and records its resources in `outcome`."""
from __future__ import annotations

import time
from pathlib import Path

from ..baselines.plugin import record_resources
from ..api import ROUTERS_DIR  # noqa: F401  (where an adapter cell keeps its bundle; importable here)
from .models import load_model, model_dtype, resolve_model_path
from .plan import Cell
from .provenance import directory_fingerprint

FINETUNED_DIR = "finetuned_model"   # a finetune cell's checkpoint, inside its work directory


def prompt_format(cell: Cell, chat: bool) -> dict:
    """How training QA rows are written (`cru_harness.prompts.qa_texts`): as the cell's evaluation asks questions
    (`chat`: `runner.evaluation.use_chat_template(cell, ...)`, which is False under a fixed TOFU format). A TOFU cell
    under its presets; an RWKU cell as RWKU's probes ask (a retain cover's neighbour questions as the neighbour-QA
    probe asks them; RWKU itself trains on passages and has no reference for question rows, docs/protocol.md)."""
    from .. import plugins
    from .evaluation import protocol_presets

    benchmark = plugins.benchmarks.get(cell.benchmark)
    if cell.kind == "finetune":   # the fine-tune writes its rows as the benchmark whose oracle it serves asks them
        presets = protocol_presets(cell.evaluation if benchmark.has_oracle else {})
        return benchmark.finetune_prompt_format(cell, chat, presets)
    return benchmark.training_prompt_format(cell, chat, protocol_presets(cell.evaluation))


def train_retain_model(cell: Cell, spec: dict, workdir: Path, data_dir, outcome: dict) -> str:
    from ..data.corpora import load_corpus
    from ..testbed.finetune import finetune_causal_lm
    from .evaluation import use_chat_template

    source = resolve_model_path(spec.get("from", cell.model.path))
    model, tokenizer = load_model(source, cell)
    # the rows as the evaluation writes them (a testbed model: the plain template, which `format_qa` also writes)
    texts = load_corpus(cell.corpora["retain_corpus"], data_dir, tokenizer=tokenizer,
                        **prompt_format(cell, use_chat_template(cell, source)))
    t0 = time.perf_counter()
    kwargs = {k: v for k, v in spec.items() if k != "from"}   # every other key validation let through
    finetune_causal_lm(model, tokenizer, texts, seed=cell.seed or 0, **kwargs)
    outcome["resources"]["train_wall_time_s"] = time.perf_counter() - t0
    out = workdir / "retain_model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def train_finetuned_model(cell: Cell, spec: dict, source_path: str, corpus: str, workdir: Path, data_dir,
                          outcome: dict, name: str = FINETUNED_DIR) -> str:
    """`source_path` fine-tuned on `corpus` with TOFU's recipe (`cru_harness.finetune`), overridden by `spec`;
    saved under workdir/`name`. The prompt is the one the cell's evaluation uses (chat template or plain)."""
    from ..finetune import FinetuneConfig, finetune
    from .evaluation import use_chat_template

    overrides = {k: v for k, v in spec.items() if k not in ("data", "dtype")}
    dtype = spec.get("dtype") or model_dtype(cell.model)
    out = workdir / name
    fmt = prompt_format(cell, use_chat_template(cell, source_path))
    result = finetune(source_path, corpus, out, config=FinetuneConfig.from_dict(overrides), seed=cell.seed or 0,
                      data_dir=data_dir, dtype=dtype, device=cell.device, device_map=cell.model.device_map,
                      chat_template=fmt["chat"], **{k: fmt[k] for k in ("preset", "family") if k in fmt}, overwrite=True,
                      progress=False, trust_remote_code=cell.model.trust_remote_code)
    outcome["details"]["training_prompts"] = fmt
    record_resources(outcome, result.resources)
    # The weights' fingerprint: a run that must fine-tune again elsewhere compares its checkpoint with this one.
    outcome["details"]["finetune"] = {**{k: v for k, v in result.to_dict().items() if k != "history"},
                                      "checkpoint_fingerprint": directory_fingerprint(out)}
    outcome["artifacts"]["checkpoint"] = str(out)
    return str(out)
