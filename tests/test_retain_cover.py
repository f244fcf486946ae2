"""Issue 11's retain-cover option at the GPU scale (configs/studies/options.yaml, options_report.yaml): retain data
covering what must survive, drawn from RWKU question probes of targets the evaluation never touches, so that no
evaluated probe (and no evaluated person or work, by name) is trained on while every evaluation set stays whole."""
import re
from pathlib import Path

import pytest

from cru_harness.benchmarks.rwku.data import list_targets, load_target_file, parse_targets
from cru_harness.benchmarks.tofu.data import load_tofu
from cru_harness.data import load_corpus_rows
from cru_harness.runner.plan import build_plan
from cru_harness.studies.config import load_study

STUDIES = Path(__file__).resolve().parents[1] / "configs" / "studies"
CONFIGS = ("options.yaml", "options_report.yaml")
EVALUATED_RWKU = range(1, 22)     # the candidates of select_known (1-20) and the retain passages' target (21)
CANDIDATES = range(101, 201)
COVER_KINDS = ("forget_level2", "neighbor_level2")


def _covers(name):
    config = load_study(STUDIES / name).config
    methods = {(m.label, bench): m for m in config.methods for bench in m.benchmarks}
    return config, methods


def _cover_targets(source: str) -> list[list[int]]:
    """The target list of each RWKU question source in a corpus string, parsed (one per source, in order)."""
    return [parse_targets(spec) for spec in re.findall(r"rwku:([0-9,\-]+):(?:forget|neighbor)_level2", source)]


def _name_pattern(names):
    names = sorted({n for n in names if len(n) >= 4}, key=len, reverse=True)
    return re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b", re.IGNORECASE)


def _allowed_targets(shared_data) -> list[int]:
    """The rule the configs' target list follows (their comment): of targets 101-200, leave out any whose level-2
    rows ask an evaluated question or name a subject or neighbour of targets 1-21 or a TOFU real-author answer, or
    whom TOFU's real-author / world-fact questions name."""
    targets = {t.index: t for t in list_targets(shared_data)}
    evaluated = {targets[i].name for i in EVALUATED_RWKU}
    for index in EVALUATED_RWKU:
        for kind in ("neighbor_level1", "neighbor_level2"):
            evaluated |= {row["neighbor"].split(" (")[0] for row in load_target_file(index, kind, shared_data)}
    tofu_sets = [load_tofu(name, shared_data) for name in ("real_authors", "world_facts")]
    evaluated |= {row["answer"] for row in tofu_sets[0]}
    tofu_text = "\n".join(f"{row['question']} {row['answer']}" for rows in tofu_sets for row in rows)
    named, probes = _name_pattern(evaluated), _evaluated_questions(shared_data)
    allowed = []
    for index in CANDIDATES:
        if re.search(rf"\b{re.escape(targets[index].name)}\b", tofu_text, re.IGNORECASE):
            continue
        rows = [row for kind in COVER_KINDS for row in load_target_file(index, kind, shared_data)]
        if not any(row["query"] in probes or
                   named.search(" ".join((row["query"], row["answer"], row.get("neighbor", ""), row["subject"])))
                   for row in rows):
            allowed.append(index)
    return allowed


def _evaluated_questions(shared_data) -> set[str]:
    """Every question the evaluation asks: TOFU's probes and the RWKU probes of targets 1-21."""
    questions = {row["question"] for split in ("forget01", "forget05", "forget10", "retain_perturbed",
                                               "real_authors_perturbed", "world_facts_perturbed")
                 for row in load_tofu(split, shared_data)}
    return questions | {row["query"] for index in EVALUATED_RWKU
                        for kind in ("forget_level1", "forget_level2", "forget_level3", "neighbor_level1",
                                     "neighbor_level2")
                        for row in load_target_file(index, kind, shared_data)}


@pytest.mark.parametrize("name", CONFIGS)
def test_retain_cover_changes_only_the_retain_corpus_of_the_paper_setting(name):
    config, methods = _covers(name)
    for (label, bench), method in methods.items():
        if label != "CRU-retain-cover":
            continue
        paper = methods[("CRU-paper", bench)]
        for split in config.benchmarks["tofu"]["splits"] if bench == "tofu" else [None]:
            assert method.hparams_for(bench, split) == paper.hparams_for(bench, split)
        assert not paper.corpora and list(method.corpora) == ["retain_corpus"]
        base = "{retain_split}" if bench == "tofu" else config.benchmarks["rwku"]["retain_corpus"]
        assert method.corpora["retain_corpus"].startswith(base + " + rwku:")
    assert {bench for label, bench in methods if label == "CRU-retain-cover"} == set(config.benchmarks)


@pytest.mark.shared_data
def test_the_cover_targets_are_the_rules_and_no_evaluated_probe_is_trained_on(shared_data):
    expected = _allowed_targets(shared_data)
    assert len(expected) == 68
    probes, retain = _evaluated_questions(shared_data), {row["question"] for row in load_tofu("retain90", shared_data)}
    for name in CONFIGS:
        config, methods = _covers(name)
        for bench in config.benchmarks:
            source = methods[("CRU-retain-cover", bench)].corpora["retain_corpus"].replace("{retain_split}", "retain90")
            assert _cover_targets(source) == [expected] * (2 if bench == "tofu" else 1), (name, bench)
            trained = {row["question"] for row in load_corpus_rows(source, shared_data)[0] if "question" in row}
            cover = trained - retain
            assert len(cover) > 50 and not cover & probes


@pytest.mark.shared_data
def test_the_cover_is_about_as_large_as_the_retain_set_it_joins(shared_data):
    config, methods = _covers("options_report.yaml")
    tofu = methods[("CRU-retain-cover", "tofu")].corpora["retain_corpus"]
    rows = {split: len(load_corpus_rows(tofu.replace("{retain_split}", split), shared_data)[0])
            for split in ("retain99", "retain90")}
    assert rows == {"retain99": 3960 + 2870, "retain90": 3600 + 2870}
    rwku = methods[("CRU-retain-cover", "rwku")].corpora["retain_corpus"]
    passages = len(load_corpus_rows("rwku:21:passage", shared_data)[0])
    assert len(load_corpus_rows(rwku, shared_data)[0]) == 2 * passages == 126
    assert rwku.count("neighbor_level2[:63]") == 1


def test_the_reduced_run_recomputes_options_report_cpus_cells_and_adds_the_gpu_cover():
    reduced = load_study(STUDIES / "retain_cover_cpu.yaml").config
    report = load_study(STUDIES / "options_report_cpu.yaml").config
    cells, shared = build_plan(reduced), {c.hash for c in build_plan(report)}
    added = [c for c in cells if c.hash not in shared]
    assert len(cells) == 12 and [(c.label, c.seed) for c in added] == [("CRU-retain-cover-rwku", s) for s in (0, 1, 2)]
    methods = {m.label: m for m in reduced.methods}
    cover, paper = methods["CRU-retain-cover-rwku"], methods["CRU"]
    assert cover.hparams == paper.hparams and list(cover.corpora) == ["retain_corpus"]
    _, gpu = _covers("options.yaml")
    assert _cover_targets(cover.corpora["retain_corpus"]) == \
        _cover_targets(gpu[("CRU-retain-cover", "tofu")].corpora["retain_corpus"])


@pytest.mark.shared_data
def test_the_reduced_cover_adds_as_many_rows_as_the_tofu_row_cover(shared_data):
    methods = {m.label: m for m in load_study(STUDIES / "retain_cover_cpu.yaml").config.methods}
    sizes = {label: len(load_corpus_rows(methods[label].corpora["retain_corpus"], shared_data)[0])
             for label in ("CRU-retain-cover", "CRU-retain-cover-rwku")}
    assert sizes == {"CRU-retain-cover": 60, "CRU-retain-cover-rwku": 60}
