"""`cru-harness report DIR...` (tables, plots, statistics of one or more run directories)."""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from ..errors import MissingInputError
from ..store import read_recorded_json
from . import stats, tables
from .provenance import listed, provenance_lines


def register(subparsers) -> None:
    report = subparsers.add_parser("report", help="leaderboards (md/csv/tex), plots and statistics of run dirs",
                                   description="Read the cells of one or more run directories and write "
                                               "leaderboard tables, plots and the method-comparison tests.")
    report.add_argument("dirs", nargs="+", help="run directories (each holding cells/)")
    report.add_argument("--out", help="output directory (default: DIR/report for one DIR, else ./report)")
    report.add_argument("--formats", help="comma-separated subset of md,csv,tex (default: for one run directory, "
                                          "what its config's `report:` named, as the run wrote it; else all three)")
    report.add_argument("--no-plots", action="store_true")
    report.set_defaults(func=cmd_report)


def recorded_report_settings(dirs: list[Path]) -> tuple[dict, str]:
    """The report settings a single run directory's config named (its plans, written by `cru-harness run`: plan.json,
    or a shard's plan.shardIofN.json, which `merge` copies), so that `cru-harness report DIR` rewrites the report
    the run wrote, the same files and bytes; the defaults for several directories, one without a plan, or plans
    that name different settings (merged runs of different configs). Returns the settings and where they came
    from."""
    from .settings import report_settings

    plans = read_plans(dirs) if len(dirs) == 1 else []
    named = {json.dumps((plan.get("config") or {}).get("report"), sort_keys=True): plan for plan in plans}
    if len(named) != 1:
        return report_settings(None), "the defaults" + (" (its plans name different report settings)"
                                                        if len(named) > 1 else "")
    recorded, = named.values()
    source = recorded.get("source") or str(dirs[0])
    return report_settings((recorded.get("config") or {}).get("report"), source), f"the run's config ({source})"


def cmd_report(args: argparse.Namespace) -> int:
    dirs = [Path(d) for d in args.dirs]
    out = Path(args.out) if args.out is not None else (dirs[0] / "report" if len(dirs) == 1 else Path("report"))
    settings, origin = recorded_report_settings(dirs)
    if args.formats is not None:   # checked by the config's own rule for `report.formats`
        from .settings import report_settings

        formats = [f.strip() for f in args.formats.split(",") if f.strip()]
        settings = report_settings({**settings, "formats": formats}, "--formats")
    from ..locations import check_files_dir, output_lock

    check_files_dir(args.out if args.out is not None else out, what="--out", own=run_owned(out))   # before anything is read: never among others' files
    print(f"report settings: {origin}{'; --formats given' if args.formats is not None else ''}")
    with output_lock(out, "--out"):
        write_report(dirs, out, formats=settings["formats"], plots=settings["plots"] and not args.no_plots,
                     stats=settings["stats"], require_cells=True)
    return 0


def run_owned(out: Path) -> bool:
    """Whether report directory `out` is a run's own (`RUN/report`): written as the run writes it, unmarked."""
    from ..store import CELLS_DIR

    out = Path(out).expanduser()
    return out.name == "report" and (out.parent / CELLS_DIR).is_dir() and not out.is_symlink()


def block_scores(results: list[dict], benchmark: str) -> dict[tuple, dict[str, float]]:
    """Trade-off score per (model, split/target) block and method label, averaged over seeds."""
    collected: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for result in results:
        if result.get("benchmark") != benchmark or result.get("kind") != "method" or result.get("status") != "ok":
            continue
        score = tables.derived_metrics(result)["tradeoff"]
        if score is not None:
            unit = tables.benchmark_view(benchmark).unit_label(result.get("split"), result.get("target"))
            collected[(result["model"], unit)][result["label"]].append(score)
    return {block: {m: stats.finite_mean(v) for m, v in methods.items()} for block, methods in collected.items()}


def compare_methods(results: list[dict], benchmark: str) -> dict:
    scores = block_scores(results, benchmark)
    return {"benchmark": benchmark, "friedman": stats.friedman(scores), "wilcoxon": stats.wilcoxon_posthoc(scores)}


def stats_markdown(comparison: dict) -> str:
    f, w = comparison["friedman"], comparison["wilcoxon"]
    lines = [f"### {comparison['benchmark'].upper()}: method comparison (trade-off = hmean(Forgetting, Utility))", ""]
    lines.append(f"- {f['message']}")
    if f.get("dropped_methods"):
        lines.append(f"- left out, scored in fewer than half of the blocks: {', '.join(f['dropped_methods'])}")
    if f.get("dropped_blocks"):
        lines.append(f"- {len(f['dropped_blocks'])} block(s) left out: not every method has a score there")
    note = tables.benchmark_view(comparison["benchmark"]).stats_note
    if note and f.get("status") == "ok":
        lines.append(f"- {note}")
    if f.get("mean_ranks"):
        ranks = ", ".join(f"{m} {r:.2f}" for m, r in sorted(f["mean_ranks"].items(), key=lambda kv: kv[1]))
        lines.append(f"- mean ranks (1 = best): {ranks}")
    if w.get("message"):
        lines.append(f"- {w['message']}")
    for entry in w.get("comparisons", []):
        lines.append(f"- {entry['message']}")
    return "\n".join(lines) + "\n"


def read_plans(dirs) -> list[dict]:
    """The run directories' plans (plan.json, and each shard's), in directory and file-name order."""
    plans = []
    for directory in dirs:
        root = Path(directory).parent if Path(directory).name == "cells" else Path(directory)
        plans += [read_recorded_json(plan, "the run's plan") for plan in sorted(root.glob("plan*.json"))]
    return plans


def planned_cells(dirs) -> dict[str, str]:
    """{cell hash: cell name} of the run directories' plans."""
    planned: dict[str, str] = {}
    for plan in read_plans(dirs):
        for cell in plan.get("cells") or []:
            planned.setdefault(cell["hash"], cell.get("cell") or cell["hash"])
    return planned


def configured_order(plans: list[dict], results: list[dict]) -> list[dict]:
    """`results` with methods in the order their configuration lists them (the tables and trade-off plots follow
    it), and within a method in plan order; a shard's plan holds only its own cells, so the methods' order comes
    from the configuration itself. Cells no plan names keep the order they were read in, after the planned ones."""
    from .settings import configured_methods

    labels: dict[str, int] = {}
    for plan in plans:
        for entry in configured_methods(plan.get("config") or {}):
            labels.setdefault(entry["label"], len(labels))
    cells = {cell["hash"]: index for index, cell in enumerate(c for plan in plans for c in plan.get("cells") or [])}
    return sorted(results, key=lambda r: (labels.get(r.get("label"), len(labels)), cells.get(r["hash"], len(cells))))


def absent_method_lines(plans: list[dict], rows: list[dict], benchmark: str) -> list[str]:
    """A line naming the methods the run's configuration lists that this benchmark's table has no row of, and why:
    a table never drops a configured method without saying so."""
    from .settings import configured_methods

    present = {row["label"] for row in rows}
    absent: dict[str, str] = {}
    for plan in plans:
        config = plan.get("config") or {}
        if benchmark not in (config.get("benchmarks") or {}):
            continue
        for entry in configured_methods(config):
            label = entry["label"]
            if label in present or any(name.startswith(f"{label} (") for name in present):
                continue
            if benchmark in entry["benchmarks"]:
                why = "configured for this benchmark, but no cell of it has a result here"
            elif entry["explicit"]:
                why = f"its entry runs it on {', '.join(entry['benchmarks'])} only"
            else:
                why = f"{entry['method']} does not run on {benchmark.upper()}"
            absent.setdefault(label, why)
    if not absent:
        return []
    return ["Configured methods without a row here: " + "; ".join(f"{label} ({why})" for label, why in absent.items())
            + ".", ""]


def unfinished_plan_lines(dirs, results: list[dict]) -> list[str]:
    """Lines naming the cells a run directory's plan (plan.json, and each shard's) holds without a result here:
    not run yet, interrupted, or invalid. A report of an unfinished run would otherwise read as the whole run."""
    done = {r["hash"] for r in results}
    lines = []
    for directory in dirs:
        planned = planned_cells([directory])
        missing = [name for cell_hash, name in planned.items() if cell_hash not in done]
        if missing:
            lines.append(f"**{len(missing)} of {len(planned)} planned cell(s) of {directory} have no result** (not "
                         f"run yet, interrupted, or invalid; `cru-harness run` computes them): {listed(missing)}\n")
    return lines


def target_selection_markdown(dirs) -> list[str]:
    """Why the RWKU targets are these: the saved `select_known` choices (runner.targets) of the run dirs."""
    from .targets import SELECTION_DIR, rank_targets

    lines: list[str] = []
    for directory in dirs:
        for path in sorted((Path(directory) / SELECTION_DIR).glob("*.json")):
            record = read_recorded_json(path, "the RWKU target choice")
            probes = record["key"]["select_known"]["probes"]
            scores = {int(target): row for target, row in record["scores"].items()}
            ranked = rank_targets({target: row["score"] for target, row in scores.items()}, len(scores))
            lines += [f"### RWKU targets of {record['model']}: chosen by what the original model knows", "",
                      f"Kept {record['chosen']}: the top {len(record['chosen'])} of {len(ranked)} candidates by "
                      f"{record['metric']}. Every candidate, best known first:", "",
                      "| Target | Name | Score | " + " | ".join(probes) + " |",
                      "|---:|---|---:|" + "---:|" * len(probes)]
            for target in ranked:
                row = scores[target]
                mark = " (kept)" if target in record["chosen"] else ""
                lines.append(f"| {target}{mark} | {row.get('target_name', '')} | {row['score']:.3f} | "
                             + " | ".join(f"{row[probe]:.3f}" for probe in probes) + " |")
            lines.append("")
    return lines


def write_report(dirs, out_dir, *, formats=("md", "csv", "tex"), plots=True, stats=True, log=print,
                 require_cells: bool = False) -> dict:
    """Write the whole report for the cells under `dirs`. Returns {name: path}. `require_cells`: refuse, in one
    line, directories without one valid cell result (`cru-harness report`; a run reports whatever it has)."""
    from ..store import atomic_write_json, atomic_write_text, load_results
    from .lr_sweep import sweep_markdown
    from .router_lr import router_lr_markdown

    from .tuning import pending_tuning, tuning_cell_hashes, tuning_markdown

    # first: a mistyped run directory creates nothing
    loaded = load_results(*dirs)
    plans = read_plans(dirs)   # the configs' method order and lists, read once
    pending, choosing = pending_tuning(dirs, plans, loaded)   # a tuned run whose rule has not chosen yet
    validation = tuning_cell_hashes(dirs) | choosing   # how settings are chosen (the Tuning section), not results
    results = tables.fill_from_oracle([r for r in loaded if r.get("hash") not in validation])
    results = tables.split_label_variants(configured_order(plans, results))
    if require_cells and not loaded:   # an empty report would read as a run with nothing in it
        raise MissingInputError(f"no valid cell results under {', '.join(str(d) for d in dirs)}: nothing to report")
    from ..locations import make_files_dir

    out_dir = make_files_dir(out_dir, own=run_owned(out_dir))
    written: dict[str, str] = {}
    summary = [f"# Report ({len(results)} cells from {', '.join(str(d) for d in dirs)})", ""]
    statuses = defaultdict(int)
    for r in results:
        statuses[r.get("status")] += 1
    summary.append("Cells by status: " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())) + "\n")
    summary += unfinished_plan_lines(dirs, [*results, *(r for r in loaded if r.get("hash") in validation)])
    summary += pending
    summary += target_selection_markdown(dirs)
    summary += tuning_markdown(dirs, loaded)
    summary += provenance_lines(dirs)
    comparisons = {}
    from .. import plugins

    for benchmark in plugins.benchmarks.names():
        view = plugins.benchmarks.get(benchmark)
        rows = tables.aggregate(results, benchmark)
        if not rows:
            continue
        renderers = {"md": tables.to_markdown, "csv": tables.to_csv, "tex": tables.to_latex}
        absent = absent_method_lines(plans, rows, benchmark)
        for fmt in formats:
            path = out_dir / f"leaderboard_{benchmark}.{fmt}"
            text = renderers[fmt](rows, benchmark)
            atomic_write_text(path, text + ("\n" + "\n".join(absent) if fmt == "md" and absent else ""))
            written[f"leaderboard_{benchmark}.{fmt}"] = str(path)
        summary += [f"## {benchmark.upper()}", "", tables.to_markdown(rows, benchmark), *absent]
        of_benchmark = [r for r in results if r.get("benchmark") == benchmark]
        summary += view.report_lines(of_benchmark, "table")        # its own blocks (TOFU: the regime check)
        summary += tables.privacy_intervals_markdown(of_benchmark, benchmark)
        summary += tables.robustness_markdown(of_benchmark, benchmark)
        summary += view.report_lines(of_benchmark, "robustness")   # (RWKU: AA per attack type)
        summary += sweep_markdown(of_benchmark)
        summary += router_lr_markdown(of_benchmark)
        for status in ("unavailable", "failed"):
            for r in (r for r in of_benchmark if r.get("status") == status):
                summary.append(f"- {status}: {r['model']} {r.get('unit')} {r['label']}: {r.get('reason')}")
        summary.append("")
        if stats:
            comparisons[benchmark] = compare_methods(results, benchmark)
            summary.append(stats_markdown(comparisons[benchmark]))
        if plots:
            from . import plots as plotting

            plot_dir = out_dir / "plots"
            for path in plotting.tradeoff_plots(rows, benchmark, plot_dir):
                written[path.name] = str(path)
            for path in view.plots(rows, plot_dir):   # a benchmark's own figures (RWKU: per probe level)
                written[path.name] = str(path)
            path = plotting.robustness_plot(tables.robustness_rows(of_benchmark, benchmark), plot_dir, benchmark)
            if path:
                written[path.name] = str(path)
            path = plotting.levels_plot(tables.levels_rows(of_benchmark, benchmark), plot_dir, benchmark)
            if path:
                written[path.name] = str(path)
            path = plotting.gate_plot(rows, plot_dir)
            if path:
                written[f"gates_{benchmark}.png"] = str(path.rename(path.with_name(f"gates_{benchmark}.png")))
    if plots:
        from . import plots as plotting

        (out_dir / "plots").mkdir(exist_ok=True)
        path = plotting.resources_plot(results, out_dir / "plots")
        if path:
            written[path.name] = str(path)
    resources = tables.resources_table(results)
    atomic_write_text(out_dir / "resources.md", resources)
    summary += ["## Resources", "", resources]
    if stats:
        atomic_write_json(out_dir / "stats.json", comparisons)
        written["stats.json"] = str(out_dir / "stats.json")
    atomic_write_text(out_dir / "report.md", "\n".join(summary))
    written["report.md"] = str(out_dir / "report.md")
    log(f"report written to {out_dir} ({len(written)} files)")
    return written
