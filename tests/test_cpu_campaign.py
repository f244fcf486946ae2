"""benchmarks/cpu_campaign/land.py: a campaign computed in another checkout lands its finished cells here, with the
plan a run of the same config writes (one format: `runner.plan.write_plan`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import cru_harness.cli
from cru_harness.runner.cli import run_config
from cru_harness.runner.config import load_config
from cru_harness.runner.plan import build_plan
from cru_harness.runner.provenance import key_libraries

from conftest import REPO_ROOT, load_benchmark


class Killed(BaseException):
    """The worker's process killed mid-cell (not an Exception: the runner must not record it as a result)."""


def _executor(calls, kill_at):
    def executor(cell, workdir):  # test double: no model
        calls.append(cell.hash)
        (workdir / "partial.txt").write_text("half")
        if len(calls) == kill_at:
            raise Killed()
        return {"metrics": {"forget_rouge_l": 0.5, "model_utility": 0.4}}
    return executor


def _records(run, hashes, **change):
    """Rewrite finished cells' run records (a committed tree, another code version, ...)."""
    for cell_hash in hashes:
        path = run / "cells" / cell_hash / "run_record.json"
        record = json.loads(path.read_text())
        for key, value in change.items():
            record[key] = dict(record.get(key) or {}, **value) if isinstance(value, dict) else value
        path.write_text(json.dumps(record))


@pytest.fixture
def campaign(tmp_path, monkeypatch):
    """A config whose run stopped mid-plan in a worktree (`wt/`): two cells finished, the third killed."""
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump({
        "name": "t", "output_dir": "results/t", "seeds": [0],
        "models": [{"name": "m", "path": "zoo:llama", "retain": {"checkpoint": "zoo:llama:retain"}}],
        "benchmarks": {"tofu": {"splits": ["forget01"]}}, "methods": [{"method": "GA", "lr": 1e-4}]}))
    (tmp_path / "wt").mkdir()
    (tmp_path / "main").mkdir()
    monkeypatch.chdir(tmp_path / "wt")
    calls = []
    with pytest.raises(Killed):
        run_config(load_config(config_path), executor=_executor(calls, kill_at=3), report=False,
                   log=lambda *_: None)
    compute = tmp_path / "wt" / "results" / "t"
    _records(compute, calls[:2], git={"dirty": False, "dirty_files": []})   # as a pinned commit's worktree has it
    monkeypatch.chdir(tmp_path / "main")
    reports = []
    monkeypatch.setattr(cru_harness.cli, "main", lambda argv: reports.append(argv) or 0)
    return config_path, compute, calls, reports


def test_land_copies_the_finished_cells_and_the_runs_plan(campaign, tmp_path):
    config_path, compute, calls, reports = campaign
    land = load_benchmark("cpu_campaign/land")
    (compute / "recomputed.jsonl").write_text('{"hash": "a"}\n{"hash": "b"}\n')
    assert land.main([str(config_path), str(compute)]) == 0
    target = tmp_path / "main" / "results" / "t"
    assert sorted(p.name for p in (target / "cells").iterdir()) == sorted(calls[:2])   # not the killed cell
    for cell_hash in calls[:2]:
        landed = target / "cells" / cell_hash
        assert sorted(p.name for p in landed.iterdir()) == ["result.json", "run_record.json"]   # no work/
        assert (landed / "result.json").read_bytes() == (compute / "cells" / cell_hash / "result.json").read_bytes()
    # the plan is the one the run wrote, byte for byte, naming the owed cell for the report
    assert (target / "plan.json").read_bytes() == (compute / "plan.json").read_bytes()
    assert [c["hash"] for c in json.loads((target / "plan.json").read_text())["cells"]] == \
        [c.hash for c in build_plan(load_config(config_path))]
    assert reports == [["report", "results/t"]]
    # landing again adds nothing twice; new recomputation lines are kept after the old
    (compute / "recomputed.jsonl").write_text('{"hash": "b"}\n{"hash": "c"}\n')
    # a landed cell made again for its model (same numbers, its own timings) keeps its first computation
    first = (target / "cells" / calls[0] / "result.json").read_bytes()
    (compute / "cells" / calls[0] / "result.json").write_text(json.dumps(
        dict(json.loads(first), resources={"cell_wall_time_s": 1687.5})))
    assert land.main([str(config_path), str(compute)]) == 0
    assert (target / "recomputed.jsonl").read_text() == '{"hash": "a"}\n{"hash": "b"}\n{"hash": "c"}\n'
    assert (target / "cells" / calls[0] / "result.json").read_bytes() == first


@pytest.mark.parametrize("change, words", [
    ({"git": {"dirty": True, "dirty_files": ["cru_harness/x.py"]}}, "uncommitted tree"),
    ({"code_version": "0000000000000000"}, "one campaign, one pinned commit"),
    ({"status": "failed"}, "run record status failed"),
])
def test_land_refuses_a_dirty_failed_or_other_code_cell(campaign, tmp_path, change, words):
    config_path, compute, calls, reports = campaign
    _records(compute, calls[1:2], **change)
    with pytest.raises(SystemExit) as stop:
        load_benchmark("cpu_campaign/land").main([str(config_path), str(compute)])
    assert words in str(stop.value) and reports == []


def test_worker_check_refuses_other_library_versions_than_the_landed_cells(campaign, capsys):
    """A new machine's pip may bring a newer accelerate: every landed cell would then be stale and computed again,
    so `worker.py --check` (which session.sh runs first) stops with the versions and the pip command instead."""
    config_path, compute, calls, _ = campaign
    worker = load_benchmark("cpu_campaign/worker")
    check = [str(config_path), str(compute), "--check"]
    here = key_libraries()
    _records(compute, calls[:2], inputs={"libraries": here})   # as a real run records them
    assert worker.main(check) == 0 and capsys.readouterr().err == ""
    _records(compute, calls[1:2], inputs={"libraries": dict(here, accelerate="0.0.1")})
    assert worker.library_drift(compute) == {"accelerate": (["0.0.1"], here["accelerate"])}
    assert worker.main(check) == 4
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and "pip install accelerate==0.0.1" in message and str(compute) in message


def test_a_landed_cells_model_is_looked_for_in_its_own_work_directory_wherever_it_landed_from(tmp_path, monkeypatch):
    """The tuned robustness campaign holds cells first computed under the tuned run's directory: their models are
    theirs (made again before an attack needs them), not a base model, though they lie outside this run directory."""
    worker = load_benchmark("cpu_campaign/worker")
    monkeypatch.chdir(tmp_path)
    root = Path("results/robust")
    elsewhere = {"artifacts": {"model": "results/tuned/cells/abc/work/retain_model"}}
    assert not worker.model_on_disk(elsewhere, root, "abc")
    (tmp_path / "results/tuned/cells/abc/work/retain_model").mkdir(parents=True)
    assert worker.model_on_disk(elsewhere, root, "abc")
    assert not worker.model_on_disk({"artifacts": {"model": "results/robust/cells/abc/work/m"}}, root, "abc")
    assert worker.model_on_disk({"artifacts": {"model": "HuggingFaceTB/SmolLM2-135M"}}, root, "abc")   # the base


def test_a_worker_starts_a_cell_that_failed_in_its_session_only_once(campaign, tmp_path, monkeypatch):
    """A failing cell is not taken again and again until the deadline (seen: 1,600 starts in a minute)."""
    import datetime as dt

    config_path, _, _, _ = campaign
    worker = load_benchmark("cpu_campaign/worker")
    calls = []

    def failing(cell, workdir):   # test double: every cell fails; a retry loop is cut short, not hung
        calls.append(cell.hash)
        if len(calls) > 20:
            raise Killed()
        raise RuntimeError("no model here")

    monkeypatch.setattr(worker, "PlanExecutor", lambda store, cells, log=None: failing)
    monkeypatch.setattr(worker, "cell_inputs", lambda cell: {"code_version": "pinned"})
    compute = tmp_path / "again" / "results" / "t"
    worker.Worker(str(config_path), str(compute), dt.datetime.now() + dt.timedelta(days=1), ["GA"]).run()
    assert calls and len(calls) == len(set(calls))


def test_worker_order_puts_each_method_cell_before_its_own_attacks():
    worker = load_benchmark("cpu_campaign/worker")
    cells = build_plan(load_config(REPO_ROOT / "configs" / "cpu_smollm2_forget01_robustness.yaml"))
    attacks = worker.attacks_by_cell(cells)
    order = worker.ordered(cells, ["GA", "CRU"], attacks)
    assert sorted(c.hash for c in order) == sorted(c.hash for c in cells)
    assert [c.kind for c in order[:3]] == ["finetune", "retain", "original"]
    retain = order[1]
    assert [c.hash for c in order[3:3 + len(attacks[retain.hash])]] == [c.hash for c in attacks[retain.hash]]
    methods = [i for i, c in enumerate(order) if c.kind == "method"]
    assert [(order[i].seed, order[i].label) for i in methods[:2]] == [(0, "GA"), (0, "CRU")]
    for i in methods:   # each method cell, then exactly its attacks
        own = attacks.get(order[i].hash, [])
        assert own and [c.hash for c in order[i + 1:i + 1 + len(own)]] == [c.hash for c in own]


def test_a_tuned_config_is_computed_and_landed_as_run_computes_it(tmp_path, monkeypatch):
    """A config with `tuning:`: the worker computes the validation cells first, saves the rule's choice once they all
    have a result, then the reported cells at the chosen settings; land.py lands the validation cells, the record and
    the reported cells, with the plan `cru-harness run` writes for the same config."""
    import datetime as dt

    from cru_harness.runner.tuning import validate_with_tuning

    from test_tuning import fake_executor, raw_config

    worker = load_benchmark("cpu_campaign/worker")
    raw = dict(raw_config(tmp_path), output_dir="results/tuned")
    config_path = tmp_path / "tuned.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    ran: list = []
    monkeypatch.setattr(worker, "PlanExecutor", lambda store, cells, log=None: fake_executor(ran))
    monkeypatch.setattr(worker, "cell_inputs", lambda cell: {"code_version": "pinned"})
    (tmp_path / "wt").mkdir()
    monkeypatch.chdir(tmp_path / "wt")
    compute = tmp_path / "wt" / "results" / "tuned"
    deadline = dt.datetime.now() + dt.timedelta(days=1)
    worker.Worker(str(config_path), str(compute), deadline, ["GD", "GA", "NPO"]).run()
    validation = [c for c in ran if c.benchmark == "tofu_author"]
    assert len(validation) == 5 and ran[:5] == validation   # 2 x 2 settings and their Original, first
    assert [c.label.split(" [")[0] for c in validation] == ["Original", "GD", "GD", "GA", "GA"]   # --order's
    reported = {(c.label, c.seed): c for c in ran if c.benchmark == "tofu" and c.kind == "method"}
    assert {key for key in reported} == {(label, seed) for label in ("GA", "GD", "NPO") for seed in (0, 1)}
    assert reported["GA", 0].hparams["learning_rate"] == 1.0e-3 and reported["GD", 1].hparams["learning_rate"] == 1.0e-4
    record = json.loads((compute / "tuning" / "tiny.json").read_text())
    assert record["methods"]["GA"]["chosen"] == {"learning_rate": 1.0e-3}
    again: list = []
    monkeypatch.setattr(worker, "PlanExecutor", lambda store, cells, log=None: fake_executor(again))
    worker.Worker(str(config_path), str(compute), deadline, ["GD", "GA", "NPO"]).run()
    assert again == []   # every cell finished: nothing is computed twice

    # landed on main: the cells, the record, and the plan `cru-harness run` writes
    _records(compute, [c.hash for c in ran], git={"dirty": False, "dirty_files": []})
    (tmp_path / "main").mkdir()
    monkeypatch.chdir(tmp_path / "main")
    reports = []
    monkeypatch.setattr(cru_harness.cli, "main", lambda argv: reports.append(argv) or 0)
    assert load_benchmark("cpu_campaign/land").main([str(config_path), str(compute)]) == 0
    target = tmp_path / "main" / "results" / "tuned"
    assert sorted(p.name for p in (target / "cells").iterdir()) == sorted(c.hash for c in ran)
    assert json.loads((target / "tuning" / "tiny.json").read_text()) == record
    assert run_config(validate_with_tuning(dict(raw, output_dir=str(tmp_path / "run"))),
                      executor=fake_executor([]), report=False, log=lambda _: None) == 0
    planned = [c["hash"] for c in json.loads((tmp_path / "run" / "plan.json").read_text())["cells"]]
    assert [c["hash"] for c in json.loads((target / "plan.json").read_text())["cells"]] == planned
    assert reports == [["report", "results/tuned"]]


def _tuned_worker_killed_after(n: int, methods: list[str], tmp_path, monkeypatch):
    """test_tuning's tuned config computed by a worker in `wt/` that is killed once `n` cells have finished:
    (config path, compute directory, the finished cells)."""
    import datetime as dt

    from test_tuning import fake_executor, raw_config

    worker = load_benchmark("cpu_campaign/worker")
    config_path = tmp_path / "tuned.yaml"
    config_path.write_text(yaml.safe_dump(dict(raw_config(tmp_path), output_dir="results/tuned")))
    ran: list = []
    computed = fake_executor(ran)

    def killed_after_n(cell, workdir):
        if len(ran) == n:
            raise Killed()
        return computed(cell, workdir)

    monkeypatch.setattr(worker, "PlanExecutor", lambda store, cells, log=None: killed_after_n)
    monkeypatch.setattr(worker, "cell_inputs", lambda cell: {"code_version": "pinned"})
    (tmp_path / "wt").mkdir()
    monkeypatch.chdir(tmp_path / "wt")
    compute = tmp_path / "wt" / "results" / "tuned"
    with pytest.raises(Killed):
        worker.Worker(str(config_path), str(compute), dt.datetime.now() + dt.timedelta(days=1), methods).run()
    return config_path, compute, ran


def test_the_choice_is_saved_after_the_last_validation_cell_and_landed_even_if_not_saved(tmp_path, monkeypatch):
    """The worker saves the rule's choice as soon as the last validation cell has finished, before it starts an
    untuned entry's cell; and land.py lands the choice (with the reported cells planned at it) from the landed
    validation cells even where no worker saved it yet, so the report never says "not chosen" beside a tuned
    plan. A saved choice that differs from the rule's stops the landing."""
    # killed when the 2 x 2 settings and their Original have finished
    config_path, compute, ran = _tuned_worker_killed_after(5, ["NPO", "GA"], tmp_path, monkeypatch)
    assert [c.benchmark for c in ran] == ["tofu_author"] * 5
    saved = compute / "tuning" / "tiny.json"
    record = json.loads(saved.read_text())
    assert record["methods"]["GA"]["chosen"] == {"learning_rate": 1.0e-3}

    saved.unlink()   # as a worker that had not re-planned yet left it
    _records(compute, [c.hash for c in ran], git={"dirty": False, "dirty_files": []})
    (tmp_path / "main").mkdir()
    monkeypatch.chdir(tmp_path / "main")
    land = load_benchmark("cpu_campaign/land")
    assert land.main([str(config_path), str(compute)]) == 0
    target = tmp_path / "main" / "results" / "tuned"
    assert json.loads((target / "tuning" / "tiny.json").read_text()) == record
    planned = {c["cell"] for c in json.loads((target / "plan.json").read_text())["cells"]}
    assert {"tiny | tofu forget01 | GA seed=0", "tiny | tofu forget01 | GD seed=1"} <= planned   # tuned: planned
    report = (target / "report" / "report.md").read_text()
    assert "has not chosen" not in report

    record["methods"]["GA"]["chosen"] = {"learning_rate": 1.0e-4}
    saved.write_text(json.dumps(record))
    with pytest.raises(SystemExit, match="saved choice differs from the rule's"):
        land.main([str(config_path), str(compute)])


def test_a_tuned_campaign_landed_before_the_rule_chose_says_so(tmp_path, monkeypatch):
    """Landed midway (a validation cell still owed), a tuned run's report says the rule has not chosen, that the
    tuned entries' reported cells are owed beyond the plan, and lists the validation cells apart from the results:
    no leaderboard is made of them."""
    config_path, compute, ran = _tuned_worker_killed_after(3, ["GA", "GD"], tmp_path, monkeypatch)
    _records(compute, [c.hash for c in ran], git={"dirty": False, "dirty_files": []})
    (tmp_path / "main").mkdir()
    monkeypatch.chdir(tmp_path / "main")
    assert load_benchmark("cpu_campaign/land").main([str(config_path), str(compute)]) == 0
    report = (tmp_path / "main" / "results" / "tuned" / "report" / "report.md").read_text()
    assert "**The tuning rule has not chosen yet**" in report and "The tuned entries (GA, GD)" in report
    assert "The 3 validation cell(s) computed so far" in report
    assert all(c.hash in report for c in ran) and "## TOFU_AUTHOR" not in report
    assert not (tmp_path / "main" / "results" / "tuned" / "tuning").exists()


@pytest.mark.parametrize("campaign", ["robustness", "tuned"])
def test_a_campaigns_pin_holds_its_config_and_the_package_code_of_its_landed_cells(campaign):
    """pin.sh names, per campaign, a commit that has the campaign's config and the very package code that computed
    the cells landed so far (the run records' commit, the later controls aside): a session at the pin continues the
    campaign instead of starting it over (a pin may move only to a commit with that code)."""
    import collections
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()

    pin_sh = REPO_ROOT / "benchmarks" / "cpu_campaign" / "pin.sh"
    pin, config = subprocess.run(["bash", "-c", f'. "{pin_sh}" {campaign} && echo "$PIN $CONFIG"'],
                                 capture_output=True, text=True, check=True).stdout.split()
    at_pin = yaml.safe_load(git("show", f"{pin}:{config}"))
    records = [json.loads(p.read_text()) for p in (REPO_ROOT / at_pin["output_dir"]).glob("cells/*/run_record.json")]
    assert records, f"{at_pin['output_dir']}: nothing landed"
    version, _ = collections.Counter(r["code_version"] for r in records).most_common(1)[0]
    commits = {r["git"]["commit"] for r in records if r["code_version"] == version}
    assert {git("rev-parse", f"{c}:cru_harness") for c in commits} == {git("rev-parse", f"{pin}:cru_harness")}, (
        f"{campaign}: pin {pin} has other package code than the commits {sorted(commits)} that computed its cells")
