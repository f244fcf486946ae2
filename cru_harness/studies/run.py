"""Run a study: the runner's cells (`runner.cli.run_config`, so caching, resume and the report are the
runner's), then the study's table (markdown + csv) and plots under `<output_dir>/study/`."""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable

from ..errors import MissingInputError
from ..store import atomic_write_text
from ..runner.config import ConfigError
from .config import Study
from .tables import mean_sd, plot_study, study_rows, to_csv, to_markdown


def header_lines(study: Study, selected: dict[str, list[int]] | None = None,
                 recorded: dict[str, Counter] | None = None) -> list[str]:
    """What every study table states: the models, the scale (splits / targets, limits), the seeds, the spread.
    `selected`: model -> the RWKU targets `select_known` chose (the candidates alone would not say which ran);
    `recorded`: benchmark -> where the finished cells' data came from (`recorded_data_sources`)."""
    config = study.config
    lines = [f"## {study.spec.title}", "", f"Study `{config.name}` ({study.spec.kind}), config "
             f"`{config.source}`, device `{config.device}`."]
    if study.spec.scale:
        lines.append(f"- scale: models, benchmarks and evaluation from `{study.spec.scale}` (`--scale`), not the "
                     "study config's own")
    for model in config.models:
        tuned = f", fine-tuned first on `{model.finetune['data']}` with TOFU's recipe" if model.finetune else ""
        lines.append(f"- model `{model.name}`: `{model.path}` ({model.dtype}){tuned}")
    for bench, spec in config.benchmarks.items():
        where = (f"splits {', '.join(spec['splits'])}" if "splits" in spec else f"targets {spec['targets']}")
        if spec.get("select_known"):
            known = spec["select_known"]
            chosen = "; ".join(f"{name}: {targets}" for name, targets in (selected or {}).items()) or "not chosen yet"
            where = (f"targets {chosen}, the top {known['top']} of candidates {spec['targets']} by the original "
                     f"model's ROUGE-L recall on {', '.join(known['probes'])} (select_known)")
        limit = spec.get("limit") or config.evaluation.get("limit")
        data = data_source(bench, spec.get("data_dir") or config.data_dir, (recorded or {}).get(bench))
        lines.append(f"- scale {bench}: {where}; data: {data}; evaluation rows per task: {limit or 'all'}")
    lines.append(f"- seeds {list(config.seeds)}: each number is the mean ± sample sd (ddof 1) over seeds "
                 "(no ± with one seed); RWKU: the mean over targets within a seed first")
    if study.spec.note:
        lines.append(f"- note: {study.spec.note}")
    return lines


def data_source(benchmark: str, data_dir: str | None, recorded: Counter | None = None) -> str:
    """Where a study's benchmark files came from, without a machine's paths (the tables are committed): what the
    finished cells' run records say (`recorded`), so that a table written again elsewhere (`--table-only`) says
    the same; the environment's answer only while no cell has finished."""
    from ..data.sources import resolve_local_dir

    local = "local files named by the environment (CRU_HARNESS_DATA_DIR or the benchmark's own variable)"
    if data_dir:
        return f"`{data_dir}` (config)"
    if recorded:
        if set(recorded) == {"local"}:
            return local
        if set(recorded) == {"hub"}:
            return "the Hugging Face Hub"
        return (f"local files for {recorded['local']} cells and the Hugging Face Hub for {recorded['hub']} "
                "(their run records)")
    from .. import plugins

    plugin = plugins.benchmarks.get(benchmark)   # its `data` hook (tofu_author: TOFU's folder)
    return local if plugin.data is not None and resolve_local_dir(plugin) is not None else "the Hugging Face Hub"


def cell_records(output_dir, hashes) -> dict[str, dict]:
    """Cell hash -> its run record ({} without one): read once per table, for every header line that reads them."""
    from ..store import CellStore

    store = CellStore(output_dir)
    return {cell_hash: store.load_record(cell_hash) or {} for cell_hash in hashes}


def recorded_data_sources(cells, records: dict[str, dict]) -> dict[str, Counter]:
    """Benchmark -> how many of `cells` read local files ("local") and how many the Hub ("hub"), as their run
    records say (`provenance.data_fingerprint`: `sha:<hash>` or `hub`); cells without a record are not counted."""
    from ..runner.provenance import HUB_DATA

    counts = defaultdict(Counter)
    for cell in cells:
        data = (records[cell.hash].get("inputs") or {}).get("data")
        if isinstance(data, str):
            counts[cell.benchmark]["hub" if data == HUB_DATA else "local"] += 1
    return dict(counts)


def base_path_for(cell, cells, store, log: Callable = print) -> str:
    """The model a cell starts from: its model's fine-tuned checkpoint (finetune cell) or the path as given. A
    finished finetune cell whose checkpoint is not on this machine (a later GPU lease, cells reused from another
    run) is fine-tuned again as the runner does (`PlanExecutor.finetuned_checkpoint`); if its weights are not the
    ones the finetune cell recorded (a GPU's kernels need not be bitwise deterministic), the log says so."""
    from ..runner.execute import PlanExecutor
    from ..runner.models import resolve_model_path
    from ..runner.plan import finetune_cell_for

    source = finetune_cell_for(cell, cells)
    if source is None:
        return resolve_model_path(cell.model.path)
    path, origin = PlanExecutor(store, cells).finetuned_checkpoint(cell, source)
    if origin["matches_recorded"] is False:
        log(f"warning: {cell.describe()}: the analysis reads model {cell.model.name} fine-tuned again here, whose "
            f"weights differ from those its finetune cell {source.hash} recorded (and its routers trained on)")
    return path


def _selected(config, *, any_code: bool = False) -> dict[str, list[int]]:
    from ..runner.targets import resolve_selected_targets

    return resolve_selected_targets(config, run=False, log=lambda *_: None, any_code=any_code)


def _plan(config, selected=None):
    from ..runner.plan import build_plan

    return build_plan(config, _selected(config) if selected is None else selected)


def other_code_lines(results: list[dict], records: dict[str, dict]) -> list[str]:
    """A header line when cells of the table were computed by other code than the table's (`--table-only` on
    committed cells, after a later commit): which code versions and commits computed them."""
    from ..runner.provenance import code_commits, code_version

    current = code_version()
    versions = code_commits(records[result["hash"]] for result in results)
    others = {v: c for v, c in versions.items() if v != current}
    if not others:
        return []
    named = "; ".join(f"code version {v} (commit {', '.join(sorted(c))})" for v, c in sorted(others.items()))
    return [f"- cells computed by other code than this table's ({current}): {named}; the table reads their "
            "numbers as they are (`--table-only`); `cru-harness study` without it recomputes them"]


def run_study(study: Study, *, force: bool = False, dry_run: bool = False, shard: str | None = None,
              table_only: bool = False, log: Callable = print, only: str | None = None,
              reuse: str | None = None) -> int:
    from ..store import WORK_DIR, CellStore, load_results
    from ..runner.cli import run_config
    from ..runner.training import ROUTERS_DIR

    config, spec = study.config, study.spec
    if table_only and (shard or dry_run or force or only or reuse):
        raise ConfigError("--table-only", "writes a study's tables from finished cells (and an overlap / gate_gap "
                          "study's saved analyses) only: not with --shard, --dry-run, --force, --only or --reuse",
                          config.source)
    if spec.kind == "overlap":
        if only:
            raise ConfigError("--only", "an overlap study trains no cells: run it without --only", config.source)
        if shard:
            raise ConfigError("study.kind", "an overlap study trains no cells, so --shard has nothing to split: "
                              "run it without --shard", config.source)
        return _run_overlap(study, force=force, dry_run=dry_run, log=log, table_only=table_only, reuse=reuse)
    # a gate_gap study reads its CRU cells' router bundles: a cell --reuse copies from another label brings its own
    reuse_bundles = spec.kind == "gate_gap"
    if shard:
        # a shard's cells alone would make a partial table: the table waits for a run without --shard
        status = run_config(config, dry_run=dry_run, force=force, shard=shard, report=False, log=log, only=only,
                            reuse=reuse, reuse_bundles=reuse_bundles)
        if not dry_run:
            log(f"study shard {shard} done; when every shard has finished (their cells in one directory: "
                f"`cru-harness merge`), run `cru-harness study` without --shard to write the table")
        return status
    status = 0 if table_only else run_config(config, dry_run=dry_run, force=force, log=log, only=only, reuse=reuse,
                                             reuse_bundles=reuse_bundles)
    if dry_run:
        return status
    selected = _selected(config, any_code=table_only)   # --table-only reads a selection as it reads cells
    cells = _plan(config, selected)
    planned = {cell.hash for cell in cells}
    # only this config's cells: a directory may still hold cells of an edited variant (other hash, same label)
    results = [r for r in load_results(config.output_dir) if r["hash"] in planned]
    labels = [m.label for m in config.methods]
    rows = study_rows(results, labels, spec.x)
    by_hash = {r["hash"]: r for r in results}
    analysed = [c for c in cells if _routes(c) and (by_hash.get(c.hash) or {}).get("status") == "ok"]
    gate_gap = None
    if spec.kind == "gate_gap" and table_only:
        # read before anything is written: a missing or mismatching analysis leaves the outputs as they were;
        # the routers are not committed, the saved analysis is what the table reads
        from .analyses import saved_analysis

        gate_gap = [(cell, saved_analysis(study.out_dir, "gate_gap", cell, required=True, rows=spec.rows))
                    for cell in analysed]
    records = cell_records(config.output_dir, planned)
    sources = recorded_data_sources(cells, records)
    header = header_lines(study, selected, sources) + [
        "- gate means: the bundle's final measurement (the whole forget set; the retain rows training drew); "
        "cost: training and whole-cell wall seconds on this run's device", *missing_lines(cells, results),
        *other_code_lines(results, records), *reused_lines(results, records), ""]
    write_outputs(study, "table", to_markdown(rows, header, spec.x), to_csv(rows, spec.x))
    plots = plot_study(rows, study.out_dir, title=spec.title, x=spec.x, collapse_line=spec.collapse_line)
    log(f"study table: {study.out_dir / 'table.md'}; plots: {', '.join(p.name for p in plots)}")
    if spec.kind == "gate_gap":
        if gate_gap is None:
            from .analyses import gate_gap_cell

            store = CellStore(config.output_dir)
            gate_gap = []
            for cell in analysed:
                recorded = (by_hash[cell.hash].get("artifacts") or {}).get("routers")
                here = store.cell_dir(cell.hash) / WORK_DIR / ROUTERS_DIR   # recorded on another machine: here
                routers = next((str(p) for p in (recorded, here) if p and Path(p).is_dir()), recorded)
                if not routers or not Path(routers).is_dir():
                    raise MissingInputError(f"cell {cell.hash} ({cell.describe()}) has no router bundle on disk "
                                            f"({routers}); re-run it with --force")
                gate_gap.append((cell, gate_gap_cell(cell, base_path_for(cell, cells, store, log), routers, spec.rows,
                                                     study.out_dir, log=log, force=force)))
        write_gate_gap(study, gate_gap, sources)
    return status


def missing_lines(cells, results: list[dict]) -> list[str]:
    """A header line naming the planned cells that did not finish (their rows average fewer seeds, or are absent)."""
    done = {r["hash"] for r in results if r.get("status") == "ok"}
    missing = [c for c in cells if c.kind != "finetune" and c.hash not in done]
    if not missing:
        return []
    named = "; ".join(c.describe() for c in missing[:8]) + (f"; and {len(missing) - 8} more" if len(missing) > 8
                                                             else "")
    return [f"- **not finished: {len(missing)} of {sum(c.kind != 'finetune' for c in cells)} cells** ({named}); "
            "see report/ for why"]


def write_outputs(study: Study, stem: str, markdown: str, csv_text: str) -> None:
    study.out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(study.out_dir / f"{stem}.md", markdown)
    atomic_write_text(study.out_dir / f"{stem}.csv", csv_text)


def _routes(cell) -> bool:
    """A cell of a method that trains router bundles on a frozen base (`Method.adapter`: CRU), whose routers the
    overlap and gate-gap analyses read."""
    plugin = cell.method_plugin
    return plugin is not None and plugin.adapter


def _group(cell) -> str:
    return f"{cell.model.name} · {cell.benchmark} {cell.unit}"


def _stat_cells(values) -> tuple[str, float | None, float | None]:
    from .tables import fmt

    mean, sd, _ = mean_sd(values)
    return fmt(mean, sd), mean, sd


def _run_overlap(study: Study, *, force: bool, dry_run: bool, log: Callable, table_only: bool = False,
                 reuse: str | None = None) -> int:
    """Localization only: the models' finetune cells (if any) run through the runner, then per CRU cell of the
    plan the forget- and retain-derived localizations are compared (no router is trained). `table_only`: the
    table from the saved analyses, nothing run."""
    from ..locations import check_not_shared_directory, check_output_dir
    from ..store import CellStore, RunLock, check_run_directory
    from ..runner.execute import PlanExecutor
    from ..runner.loop import run_cells
    from ..runner.provenance import cell_inputs
    from .analyses import overlap_cell

    config, spec = study.config, study.spec
    cells = _plan(config, _selected(config, any_code=table_only))
    cru = [c for c in cells if c.kind == "method" and _routes(c)]
    if table_only:
        from .analyses import saved_analysis

        examples = [str(n) for n in spec.examples]
        sources = recorded_data_sources(cells, cell_records(config.output_dir, [c.hash for c in cells]))
        write_overlap(study, [(cell, saved_analysis(study.out_dir, "overlap", cell, required=True, examples=examples))
                              for cell in cru], sources)
        log(f"study table: {study.out_dir / 'table.md'} (from the saved analyses)")
        return 0
    # as a run does (`runner.cli.run_config`), a dry run too: the study writes cells/ into output_dir
    check_not_shared_directory(config.output_dir, "output_dir")
    check_run_directory(config.output_dir, config.name)
    if dry_run:
        log(f"study {config.name} (overlap): {len(cru)} CRU cells localized on forget and retain with "
            f"{list(spec.examples)} examples each; finetune cells: "
            f"{sum(c.kind == 'finetune' for c in cells)}; no router training, no evaluation")
        for cell in cru:
            log(f"  {cell.hash}  {cell.describe()}")
        return 0
    check_output_dir(config.output_dir, what="output_dir", allow_existing=True)
    store = CellStore(config.output_dir, log=log)
    analyses = []
    with RunLock(config.output_dir, log=log):
        finetune = [c for c in cells if c.kind == "finetune"]
        if reuse is not None:
            from ..runner.cli import reuse_cells, run_stores

            reuse_cells(run_stores([reuse])[0].root, store, finetune, log)
        if finetune:
            counts = run_cells(finetune, store, PlanExecutor(store, cells), log=log, force=force, inputs=cell_inputs)
            if counts["failed"]:
                log(f"finetune cells failed: {counts}")
                return 1
        for cell in cru:
            analyses.append((cell, overlap_cell(cell, base_path_for(cell, cells, store, log), spec.examples,
                                                study.out_dir, log=log, force=force)))
    sources = recorded_data_sources(cells, cell_records(config.output_dir, [c.hash for c in cells]))
    write_overlap(study, analyses, sources)
    return 0


def reused_lines(results: list[dict], records: dict[str, dict]) -> list[str]:
    """A header line naming the rows whose cells `--reuse` copied from a cell of another label (same settings:
    `runner.plan.computation_key`), e.g. the study's paper-setting row as the real-regime run's CRU cells."""
    origins = defaultdict(Counter)
    for result in results:
        origin = records[result["hash"]].get("reused_from")
        if origin:
            origins[result["label"]][f"{origin['run']}'s {origin['label']}"] += 1
    if not origins:
        return []
    named = "; ".join(f"{label}: {', '.join(f'{n} cell(s) of {where}' for where, n in sorted(by.items()))}"
                      for label, by in sorted(origins.items()))
    return [f"- rows computed under another label, copied by `--reuse` (the same settings, and a label enters no "
            f"computation): {named}"]


def analysis_code_lines(analyses: list) -> list[str]:
    """Which code computed the analyses a table reads (saved in each analysis; older ones did not record it)."""
    from ..runner.provenance import code_version

    versions = Counter(result.get("code_version") or "not recorded" for _, result in analyses)
    current = code_version()
    if set(versions) <= {current}:
        return []
    named = "; ".join(f"{version} ({count} of {len(analyses)})" for version, count in sorted(versions.items()))
    return [f"- analyses computed by other code than this table's ({current}), read as saved: code version {named}"]


def write_overlap(study: Study, analyses: list, recorded: dict[str, Counter] | None = None) -> None:
    """Table: per (model, split, variant, examples, block) overlap coefficient and Spearman rho, mean ± sd over
    seeds; plot: both along the blocks, one line per example count."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for cell, result in analyses:
        for n, by_n in result["by_examples"].items():
            for block, values in by_n["blocks"].items():
                groups[(_group(cell), cell.label, n, int(block))].append(
                    {**values, "n_forget": by_n["n_forget"], "n_retain": by_n["n_retain"]})
    header = header_lines(study, recorded=recorded) + [
        "- overlap coefficient |C_f ∩ C_r| / |C_f| (`cru.localize.compare_localizations`; one percentile gives "
        "equal sizes, so this is |∩| / min) of the coordinates selected from forget and from retain texts; "
        "Spearman ρ of the two per-coordinate variance vectors "
        "(scipy.stats.spearmanr); examples: drawn per seed from each corpus ('all' = the whole corpus)",
        *analysis_code_lines(analyses), ""]
    md = header + ["| block group | variant | examples (forget/retain) | block | overlap | Spearman ρ |",
                   "|---|---|---|---|---|---|"]
    csv_lines = ["group,variant,examples,n_forget,n_retain,block,n_seeds,overlap_mean,overlap_sd,rho_mean,rho_sd"]
    for (group, label, n, block), items in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2],
                                                                                   kv[0][3])):
        o_text, o_mean, o_sd = _stat_cells([i["overlap"] for i in items])
        r_text, r_mean, r_sd = _stat_cells([i["spearman_rho"] for i in items])
        md.append(f"| {group} | {label} | {n} ({items[0]['n_forget']}/{items[0]['n_retain']}) | {block} | "
                  f"{o_text} | {r_text} |")
        csv_lines.append(",".join(str(v if v is not None else "") for v in (
            f'"{group}"', label, n, items[0]["n_forget"], items[0]["n_retain"], block, len(items),
            o_mean, o_sd, r_mean, r_sd)))
    write_outputs(study, "table", "\n".join(md) + "\n", "\n".join(csv_lines) + "\n")
    if study.spec.paper:
        write_overlap_paper(study, analyses, header)
    _line_plot(study, groups, [("overlap coefficient", [("overlap", "")], True, None),
                               ("Spearman ρ", [("spearman_rho", "")], False, None)], "overlap")


GATE_GAP_COLUMNS = (("forget_mean", "forget gate"), ("retain_seen_mean", "retain gate (trained rows)"),
                    ("retain_held_out_mean", "retain gate (held-out rows)"), ("auc_seen", "AUC (trained rows)"),
                    ("auc_held_out", "AUC (held-out rows)"))


def write_gate_gap(study: Study, analyses: list, recorded: dict[str, Counter] | None = None) -> None:
    """Table: per (model, split, variant, block | all) mean gate on forget tokens, on retain tokens of rows
    training drew and of rows it never drew, and the per-token AUC against each; mean ± sd over seeds. Plot: the
    gates and both AUCs along the blocks."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for cell, result in analyses:
        seen, held = result["retain_seen"], result["retain_held_out"]
        for block in seen:
            groups[(_group(cell), cell.label, "all", -1 if block == "all" else int(block))].append({
                "forget_mean": seen[block]["forget_mean"], "retain_seen_mean": seen[block]["retain_mean"],
                "retain_held_out_mean": held[block]["retain_mean"], "auc_seen": seen[block]["auc"],
                "auc_held_out": held[block]["auc"], "rows": (result["n_forget_rows"], result["n_retain_seen_rows"],
                                                             result["n_retain_held_out_rows"])})
    rows_note = study.spec.rows or "all"
    header = header_lines(study, recorded=recorded) + [
        f"- tokens: every real token of the first {rows_note} rows of each CRU cell's forget corpus (all trained "
        f"on), of the retain rows its training drew, and of the retain rows it never drew (held out; from the "
        "training's own seeded schedule); a token's gate = its mean over the block's selected coordinates; "
        "block 'all' = the token's mean over the gated blocks",
        "- AUC: P(a retain token's gate > a forget token's gate), ties half (Mann–Whitney U / (n_f n_r), "
        "scipy.stats.mannwhitneyu); 0.5 = the gate cannot tell the corpora apart", *analysis_code_lines(analyses), ""]
    md = header + ["| block group | variant | rows (forget / retain trained / held out) | block | " +
                   " | ".join(name for _, name in GATE_GAP_COLUMNS) + " |", "|---|---|---|---|" + "---|" * 5]
    csv_lines = ["group,variant,block,n_seeds," + ",".join(f"{k}_mean,{k}_sd" for k, _ in GATE_GAP_COLUMNS)]
    for (group, label, _, block), items in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][3])):
        cols = [_stat_cells([i[k] for i in items]) for k, _ in GATE_GAP_COLUMNS]
        name = "all" if block < 0 else str(block)
        md.append(f"| {group} | {label} | {' / '.join(map(str, items[0]['rows']))} | {name} | " +
                  " | ".join(c[0] for c in cols) + " |")
        csv_lines.append(",".join(str(v) if v is not None else "" for v in (
            f'"{group}"', label, name, len(items), *[x for c in cols for x in c[1:]])))
    write_outputs(study, "gate_gap", "\n".join(md) + "\n", "\n".join(csv_lines) + "\n")
    if study.spec.paper:
        write_gate_gap_paper(study, groups, header)
    per_block = {k: v for k, v in groups.items() if k[3] >= 0}
    _line_plot(study, per_block, [
        ("mean gate", [("forget_mean", "forget"), ("retain_seen_mean", "retain, trained rows"),
                       ("retain_held_out_mean", "retain, held-out rows")], True, None),
        ("per-token AUC (0.5: the gates cannot tell the corpora apart)",
         [("auc_seen", "AUC, retain trained rows"), ("auc_held_out", "AUC, retain held-out rows")], True, 0.5)],
        "gate_gap")


#: The paper's figures these two studies are read beside (docs/cru_method.md, "What the paper reports").
PAPER_GATE_GAP = ("TOFU forget10, four models", "0.01–0.06", "0.79–0.85")
PAPER_OVERLAP = ("TOFU forget01, p 95, 40 / 40 examples, mean over the gated blocks", "0.27 (Llama), 0.38 (DeepSeek), "
                 "0.46 (Phi), 0.59 (Qwen)", "0.18, 0.37, 0.44, 0.46")
#: The blocks the paper averages its overlap over: the gated ones, the last 4 at the default last_k.
PAPER_GATED_BLOCKS = 4


def write_overlap_paper(study: Study, analyses: list, header: list[str]) -> None:
    """`paper.md` / `paper.csv`: per variant and example count, the overlap and Spearman rho averaged over the
    last `PAPER_GATED_BLOCKS` blocks (per seed, then mean ± sd over seeds), beside the paper's figure."""
    import numpy as np

    per_seed: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for cell, result in analyses:
        for n, by_n in result["by_examples"].items():
            blocks = sorted(by_n["blocks"], key=int)[-PAPER_GATED_BLOCKS:]
            per_seed[(_group(cell), cell.label, n)].append(
                (float(np.mean([by_n["blocks"][b]["overlap"] for b in blocks])),
                 float(np.mean([by_n["blocks"][b]["spearman_rho"] for b in blocks]))))
    md = header + [f"Beside the paper: the mean over the last {PAPER_GATED_BLOCKS} blocks (the gated ones at the "
                   "default last_k) per seed, then mean ± sd over seeds.", "",
                   "| block group | variant | examples | overlap | Spearman ρ |", "|---|---|---|---|---|"]
    csv_lines = ["group,variant,examples,n_seeds,overlap_mean,overlap_sd,rho_mean,rho_sd"]
    for (group, label, n), values in sorted(per_seed.items()):
        (o_text, o_mean, o_sd), (r_text, r_mean, r_sd) = (_stat_cells([v[0] for v in values]),
                                                          _stat_cells([v[1] for v in values]))
        md.append(f"| {group} | {label} | {n} | {o_text} | {r_text} |")
        csv_lines.append(",".join(str(v if v is not None else "") for v in (
            f'"{group}"', label, n, len(values), o_mean, o_sd, r_mean, r_sd)))
    where, overlap, rho = PAPER_OVERLAP
    md.append(f"| the paper: {where} | – | 40 | {overlap} | {rho} |")
    write_outputs(study, "paper", "\n".join(md) + "\n", "\n".join(csv_lines) + "\n")


def write_gate_gap_paper(study: Study, groups: dict, header: list[str]) -> None:
    """`paper.md` / `paper.csv`: per variant, the mean gate on forget and on retain tokens over the gated blocks
    (block 'all') and their gap, beside the paper's figures (its retain rows: those training drew)."""
    md = header + ["Beside the paper: block 'all' of the table above (a token's gate averaged over the gated blocks); "
                   "gap = retain gate (trained rows) − forget gate, per seed, then mean ± sd over seeds.", "",
                   "| block group | variant | forget gate | retain gate (trained rows) | gap |", "|---|---|---|---|---|"]
    csv_lines = ["group,variant,n_seeds,forget_mean,forget_sd,retain_mean,retain_sd,gap_mean,gap_sd"]
    for (group, label, _, block), items in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if block >= 0:
            continue
        forget, retain = _stat_cells([i["forget_mean"] for i in items]), _stat_cells([i["retain_seen_mean"]
                                                                                       for i in items])
        gap = _stat_cells([i["retain_seen_mean"] - i["forget_mean"] for i in items])
        md.append(f"| {group} | {label} | {forget[0]} | {retain[0]} | {gap[0]} |")
        csv_lines.append(",".join(str(v if v is not None else "") for v in (
            f'"{group}"', label, len(items), *forget[1:], *retain[1:], *gap[1:])))
    where, forget_text, retain_text = PAPER_GATE_GAP
    md.append(f"| the paper: {where} | – | {forget_text} | {retain_text} | not given (ranges over models only) |")
    write_outputs(study, "paper", "\n".join(md) + "\n", "\n".join(csv_lines) + "\n")


def _line_plot(study: Study, groups: dict, panels, stem: str) -> Path:
    from ..reporting.plots import plt, save_figure

    fig = line_figure(groups, panels, title=study.spec.title)
    path = study.out_dir / f"{stem}.png"
    study.out_dir.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def line_figure(groups: dict, panels, *, title: str):
    """{(group, variant, examples, block): [per-seed values]} along the blocks, one panel per (title, lines,
    unit interval?, chance line?). `lines`: (key, name) drawn for every (group, variant, examples), one colour
    per variant and one line style per key or example count, so that two series with the same values (40
    examples and 'all' where a corpus has at most 40) both show. A series with no values is left out; a line no
    variant has values for is named in the panel's title. The legend sits below the panels."""
    from matplotlib.ticker import MaxNLocator

    from ..reporting.plots import distinct_colors, plt

    series: dict[tuple, list] = defaultdict(list)
    for (group, label, n, block), items in groups.items():
        series[(group, label, n)].append((block, items))
    variants = list(dict.fromkeys((group, label) for group, label, _ in sorted(series)))
    counts = list(dict.fromkeys(n for _, _, n in sorted(series)))
    colours = dict(zip(variants, distinct_colors(len(variants))))
    styles = [("-", "o", "full"), ("--", "s", "none"), (":", "^", "full"), ("-.", "D", "none")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    handles: dict[str, object] = {}
    for ax, (heading, lines, unit, chance) in zip(axes[0], panels):
        drawn = set()
        for (group, label, n), points in sorted(series.items()):
            points.sort(key=lambda p: p[0])
            for line, (key, name) in enumerate(lines):
                stats = [mean_sd([i[key] for i in items]) for _, items in points]
                xs = [b for (b, _), s in zip(points, stats) if s[0] is not None]
                if not xs:
                    continue
                drawn.add(key)
                ys = [s[0] for s in stats if s[0] is not None]
                es = [s[1] or 0.0 for s in stats if s[0] is not None]
                linestyle, marker, fill = styles[(line if len(lines) > 1 else counts.index(n)) % len(styles)]
                tag = ", ".join(t for t in (name, f"{n} ex." if len(counts) > 1 or n != "all" else "") if t)
                text = f"{group}: {label}" + (f" ({tag})" if tag else "")
                handles[text] = ax.errorbar(xs, ys, yerr=es, capsize=3, color=colours[(group, label)],
                                            linestyle=linestyle, marker=marker, fillstyle=fill, label=text,
                                            markersize=5 if fill == "full" else 8)   # a hollow one rings a full one
        if unit:
            ax.set_ylim(-0.02, 1.02)
        if chance is not None:
            ax.axhline(chance, color="k", linestyle="--", linewidth=1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # blocks are whole numbers
        ax.set_xlabel("block")
        missing = [name or heading for key, name in lines if key not in drawn]   # no variant has a value
        absent = f"\n(no values at this scale: {', '.join(missing)})" if missing else ""
        ax.set_title(heading + absent, fontsize=9)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    if handles:
        fig.legend(list(handles.values()), list(handles), fontsize=7, loc="upper center", frameon=False,
                   bbox_to_anchor=(0.5, 0.0), ncol=max(1, min(3, len(handles))))
    return fig
