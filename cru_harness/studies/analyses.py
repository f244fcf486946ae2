"""The two analyses that read models, not only cells: `overlap` (forget- vs retain-derived localizations per
block; no router training) and `gate_gap` (a trained bundle's gates token by token on forget vs retain).

Both work per CRU cell of the plan: its model (the fine-tuned checkpoint when the model has `finetune:`), its
corpora written as its training wrote them (`runner.prompting.prompt_format`), its seed and its CRU settings
(`cru.train.RouterTrainingConfig`, the one place their defaults live). Each cell's analysis is saved under
`study/analysis/<cell hash>.json` (atomically), so a killed study resumes.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import MissingInputError
from ..store import atomic_write_json
from ..runner.provenance import code_version
from ..runner.plan import Cell


def analysis_path(out_dir: Path, kind: str, cell: Cell) -> Path:
    return out_dir / "analysis" / f"{kind}_{cell.hash}.json"


def analysis_settings(kind: str, saved: dict) -> dict:
    """What a saved analysis was computed with, the one rule for reusing it: gate_gap, the bundle's weights and
    the rows; overlap, the base model and the example counts."""
    if kind == "overlap":
        return {"base": saved.get("base"), "examples": list(saved.get("by_examples") or {})}
    return {"weights_sha256": saved.get("weights_sha256"), "rows": saved.get("rows")}


def saved_analysis(out_dir: Path, kind: str, cell: Cell, *, required: bool = False, **expected) -> dict | None:
    """A cell's saved analysis when it was computed with the `expected` settings (`analysis_settings`), else
    None. `required` (`study --table-only`: nothing is loaded or recomputed): a missing one, or one computed with
    other settings, raises instead, since the table would describe another analysis."""
    path = analysis_path(out_dir, kind, cell)
    if not path.is_file():
        if required:
            raise MissingInputError(f"cell {cell.hash} ({cell.describe()}) has no saved {kind} analysis ({path}): "
                                    "run the study without --table-only")
        return None
    saved = json.loads(path.read_text())
    settings = analysis_settings(kind, saved)
    differ = [key for key, value in expected.items() if settings.get(key) != value]
    if differ and required:
        named = ", ".join(f"{key}={settings.get(key)!r} (the study: {expected[key]!r})" for key in differ)
        raise MissingInputError(f"{path} was computed with {named}: run the study without --table-only")
    return None if differ else saved


def load_cell_model(cell: Cell, base_path: str):
    """(model, tokenizer, forget texts, retain texts, config) of a CRU cell, as its router training reads them; the
    config's `template` attribute is the prompt format's (`cru.readings.prompt_template`) where an option needs it."""
    from ..cru.train import RouterTrainingConfig
    from ..data.corpora import load_corpus
    from ..runner.prompting import use_chat_template
    from ..runner.models import load_model, resolve_data_dir
    from ..runner.prompting import prompt_format

    data_dir = resolve_data_dir(cell.data_dir)
    model, tokenizer = load_model(base_path, cell)
    fmt = prompt_format(cell, use_chat_template(cell, base_path))
    forget = load_corpus(cell.corpora["forget_corpus"], data_dir, tokenizer=tokenizer, **fmt)
    retain = load_corpus(cell.corpora["retain_corpus"], data_dir, tokenizer=tokenizer, **fmt)
    config = RouterTrainingConfig(**cell.hparams, seed=cell.seed or 0, progress=False)
    config.template = None
    if (config.token_scope, config.localization_tokens) != ("all", "all"):
        from ..cru.readings import prompt_template

        config.template = prompt_template(tokenizer, **fmt)
    return model, tokenizer, forget, retain, config


def subsample(texts: list[str], n, seed: int) -> list[str]:
    """`n` texts drawn without replacement (seeded, in corpus order), or all of them for 'all' / n >= len."""
    if n == "all" or n >= len(texts):
        return list(texts)
    rng = np.random.default_rng(seed)
    return [texts[i] for i in sorted(rng.choice(len(texts), size=n, replace=False))]


def overlap_cell(cell: Cell, base_path: str, examples, out_dir: Path, log: Callable = print, *,
                 force: bool = False) -> dict:
    """Per block and per example count: the overlap coefficient of the forget- and retain-derived selections
    and Spearman's rho of their per-coordinate variance vectors (`cru.localize.compare_localizations`)."""
    path = analysis_path(out_dir, "overlap", cell)
    saved = None if force else saved_analysis(out_dir, "overlap", cell, base=base_path,
                                              examples=[str(n) for n in examples])
    if saved is not None:
        return saved
    import torch

    from ..cru.localize import compare_localizations, localize

    model, tokenizer, forget, retain, config = load_cell_model(cell, base_path)
    seed = cell.seed or 0
    result = {"cell": cell.hash, "code_version": code_version(), "base": base_path, "label": cell.label, "seed": seed,
              "selection": config.selection, "percentile": config.percentile, "by_examples": {}}
    with torch.no_grad():
        for n in examples:
            f_texts, r_texts = subsample(forget, n, seed), subsample(retain, n, seed + 1)
            kwargs = dict(blocks=config.blocks, last_k=config.last_k, percentile=config.percentile,
                          selection=config.selection, seed=seed, batch_size=config.batch_size,
                          max_length=config.max_length)
            # the gate site and magnitude exclusion (RouterTrainingConfig options) shape the selection too
            kwargs.update({key: getattr(config, name) for key, name in
                           (("site", "gate_site"), ("exclude_top_magnitude", "exclude_top_magnitude"))
                           if hasattr(config, name)})
            # the readings of the cell's options (cru.readings): which output, which positions are pooled
            kwargs.update(block_output=config.block_output, tokens=config.localization_tokens,
                          template=config.template)
            compared = compare_localizations(localize(model, tokenizer, f_texts, **kwargs),
                                             localize(model, tokenizer, r_texts, **kwargs))
            result["by_examples"][str(n)] = {
                "n_forget": len(f_texts), "n_retain": len(r_texts),
                "blocks": {str(b): {"overlap": c.overlap, "spearman_rho": c.spearman_rho,
                                    "spearman_pvalue": c.spearman_pvalue, "n_selected": c.n_forget,
                                    "n_shared": c.n_shared} for b, c in compared.items()}}
            log(f"  overlap {cell.describe()} n={n}: mean overlap "
                f"{np.mean([c.overlap for c in compared.values()]):.3f}")
    atomic_write_json(path, result)
    return result


class TokenGates:
    """Gate observer keeping, per block, each real token's gate averaged over the block's selected coordinates."""

    def __init__(self):
        self.mask = None
        self.values: dict[int, list[np.ndarray]] = {}

    def __call__(self, block: int, _bundle, gates) -> None:
        per_token = gates.float().mean(dim=-1)                       # (B, T)
        keep = self.mask.to(per_token.device).bool()
        self.values.setdefault(block, []).append(per_token[keep].cpu().numpy())

    def tokens(self, block: int) -> np.ndarray:
        return np.concatenate(self.values.get(block, [np.zeros(0)]))


def observe_gates(model, tokenizer, bundle, texts: list[str], recorder, *, batch_size: int, max_length: int):
    """Run `texts` through `model` up to the bundle's last gated block, right-padded in batches, with `recorder`
    (a gate observer, `cru.attach.GateObserver`) seeing every router's gates; before each batch its `mask` is set
    to the positions the bundle's gates act on (`cru.train.observed_mask`: every real token, or the answer scope of
    a `token_scope="answer"` bundle). Returns `recorder`."""
    import torch

    from ..cru.attach import attach_bundles
    from ..cru.train import observed_mask, run_gated
    from ..cru.localize import collate, input_device, pad_token_id, tokenize_texts

    ids = tokenize_texts(tokenizer, texts, max_length)
    pad = pad_token_id(tokenizer)
    bundle.eval()
    handle = attach_bundles(model, [bundle], observer=recorder)
    try:
        with torch.no_grad():
            for start in range(0, len(ids), batch_size):
                batch = collate(ids[start:start + batch_size], pad).to(input_device(model))
                recorder.mask = observed_mask(bundle, batch)
                run_gated(model, bundle, batch)
    finally:
        handle.remove()
    return recorder


def token_gates(model, tokenizer, bundle, texts: list[str], *, batch_size: int, max_length: int
                ) -> dict[int, np.ndarray]:
    """Per gated block: the per-token gates (mean over selected coordinates) of every real token of `texts`."""
    recorder = observe_gates(model, tokenizer, bundle, texts, TokenGates(), batch_size=batch_size,
                             max_length=max_length)
    return {b: recorder.tokens(b) for b in bundle.block_indices}


def gate_auc(forget: np.ndarray, retain: np.ndarray) -> float:
    """P(a retain token's gate > a forget token's gate), ties counted half: the AUC of the gate as a
    forget-vs-retain classifier (0.5 = cannot tell them apart; 1 = every retain token passes more)."""
    from scipy.stats import mannwhitneyu

    if len(forget) == 0 or len(retain) == 0:
        return float("nan")
    return float(mannwhitneyu(retain, forget, alternative="two-sided").statistic / (len(forget) * len(retain)))


def retain_rows_split(n_forget: int, n_retain: int, config) -> tuple[list[int], list[int]]:
    """(retain rows training drew, in the order first drawn; retain rows it never drew, in corpus order), from
    the training's own seeded schedule (`cru.train.schedule_for`)."""
    from ..cru.train import schedule_for

    drawn: dict[int, None] = {}
    for _, rows in schedule_for(n_forget, n_retain, config):
        drawn.update(dict.fromkeys(rows))
    return list(drawn), [i for i in range(n_retain) if i not in drawn]


def _summary(forget: dict, retain: dict, blocks) -> dict:
    """Per block and over all blocks (a token's gate = its mean over the gated blocks): mean gates and AUC."""
    out = {str(b): {"forget_mean": float(forget[b].mean()), "retain_mean": _mean(retain[b]),
                    "auc": gate_auc(forget[b], retain[b])} for b in blocks}
    f_all = np.mean([forget[b] for b in blocks], axis=0)
    r_all = np.mean([retain[b] for b in blocks], axis=0) if len(retain[blocks[0]]) else np.zeros(0)
    out["all"] = {"forget_mean": float(f_all.mean()), "retain_mean": _mean(r_all), "auc": gate_auc(f_all, r_all)}
    return out


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else float("nan")


def gate_gap_cell(cell: Cell, base_path: str, routers: str, rows, out_dir: Path, log: Callable = print, *,
                  force: bool = False) -> dict:
    """Per gated block and over all of them: mean gate on forget tokens and on retain tokens, and the per-token
    AUC, twice: against retain rows training drew and against retain rows it never drew (held out; what a
    router must generalise to). Rows: the first `rows` of each (None: all); forget rows are all trained on."""
    from ..cru.bundle import MANIFEST_NAME, RouterBundle

    # a saved analysis is reused only for the same bundle (a re-trained cell has new weights) and rows
    weights = json.loads((Path(routers) / MANIFEST_NAME).read_text()).get("weights_sha256")
    path = analysis_path(out_dir, "gate_gap", cell)
    saved = None if force else saved_analysis(out_dir, "gate_gap", cell, weights_sha256=weights, rows=rows)
    if saved is not None:
        return saved

    model, tokenizer, forget, retain, config = load_cell_model(cell, base_path)
    bundle = RouterBundle.from_pretrained(routers)
    trained_on = (bundle.config.training_data or {}).get("retain", {}).get("n_examples")
    if trained_on is not None and trained_on != len(retain):
        raise RuntimeError(f"cell {cell.hash}: its routers trained on {trained_on} retain rows, the corpus "
                           f"{cell.corpora['retain_corpus']} now has {len(retain)}")
    seen, held_out = retain_rows_split(len(forget), len(retain), config)
    take = (lambda items: items[:rows]) if rows else (lambda items: items)
    kwargs = dict(batch_size=config.batch_size, max_length=config.max_length)
    blocks = list(bundle.block_indices)
    f_gates = token_gates(model, tokenizer, bundle, take(forget), **kwargs)
    result = {"cell": cell.hash, "code_version": code_version(), "weights_sha256": weights, "rows": rows,
              "label": cell.label, "seed": cell.seed or 0, "n_forget_rows": len(take(forget))}
    for name, indices in (("retain_seen", seen), ("retain_held_out", held_out)):
        chosen = take(indices)
        r_gates = token_gates(model, tokenizer, bundle, [retain[i] for i in chosen], **kwargs) if chosen else \
            {b: np.zeros(0) for b in blocks}
        result[f"n_{name}_rows"] = len(chosen)
        result[name] = _summary(f_gates, r_gates, blocks)
    seen, held = result["retain_seen"]["all"], result["retain_held_out"]["all"]
    log(f"  gate gap {cell.describe()}: forget {seen['forget_mean']:.3f}, retain trained rows "
        f"{seen['retain_mean']:.3f} / held out {held['retain_mean']:.3f}, AUC {seen['auc']:.3f} / {held['auc']:.3f}")
    atomic_write_json(path, result)
    return result
