"""Issue 9, runner: one run per output directory (a real second process is refused, a dead one's lock is taken
over), result/record files validated on read (an invalid one is named and its cell recomputed, never counted
as done), and the output directory checked before any work. Executors here are test doubles: no model."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cru_harness.runner import config as cfg
from cru_harness.store import CellStore, RunLock, RunLockedError, load_results
from cru_harness.runner.cli import run_config
from cru_harness.runner.loop import run_cells
from cru_harness.runner.plan import build_plan

# A child process running `cru-harness run` through the real command line, with the real executor swapped for
# a test double that records each call and, mid-cell, waits until the file RELEASE exists (no model is loaded).
CHILD = """
import os, sys, time
import cru_harness.runner.execute as execute

class FakeExecutor:
    def __init__(self, store, cells, log=None):
        pass

    def __call__(self, cell, workdir):
        with open(os.environ["CALLS"], "a") as handle:
            handle.write(f"{os.getpid()} {cell.hash}\\n")
        (workdir / "partial.txt").write_text(str(os.getpid()))
        deadline = time.monotonic() + 60
        while not os.path.exists(os.environ["RELEASE"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"metrics": {"forget_rouge_l": 0.5}}

execute.PlanExecutor = FakeExecutor
from cru_harness.cli import main
sys.exit(main(["run", sys.argv[1], "--no-report"]))
"""


def write_config(tmp_path, **extra) -> Path:
    # A local model path: nothing to build or download, and the fake executor never opens it.
    raw = {"name": "t", "output_dir": str(tmp_path / "run"), "seeds": [0, 1],
           "models": [{"name": "m", "path": str(tmp_path)}], "benchmarks": {"tofu": {"splits": ["forget01"]}},
           "methods": [{"method": "GA"}], **extra}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def fake(calls):
    def executor(cell, workdir):  # test double
        calls.append(cell.hash)
        return {"metrics": {"forget_rouge_l": 0.5}}
    return executor


def test_two_runners_on_one_directory_in_real_processes(tmp_path):
    config_path = write_config(tmp_path)
    config = cfg.load_config(config_path)
    n_cells = len(build_plan(config))
    calls = tmp_path / "calls.txt"
    release = tmp_path / "release"
    env = {**os.environ, "CALLS": str(calls), "RELEASE": str(release)}
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    first = subprocess.Popen([sys.executable, str(script), str(config_path)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    lock = config.output_dir / ".lock"
    deadline = time.monotonic() + 60
    while not calls.is_file():  # the first holds the lock and is inside its first cell
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.05)
    second = subprocess.run([sys.executable, str(script), str(config_path)], env=env, capture_output=True,
                            text=True, timeout=120)
    release.touch()
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert second.returncode == 2
    message = second.stderr.strip().splitlines()
    assert len(message) == 1, second.stderr
    assert message[0].startswith(f"cru-harness run: error: output directory {config.output_dir} is in use by "
                                 f"process {first.pid} on host {socket.gethostname()}")
    assert "Traceback" not in second.stderr
    # Nothing of the first run was touched: every cell computed once, by the first process, one result each.
    lines = calls.read_text().split()
    assert lines[0::2] == [str(first.pid)] * n_cells and len(set(lines[1::2])) == n_cells
    results = load_results(config.output_dir)
    assert len(results) == n_cells and all(r["status"] == "ok" for r in results)
    for cell_dir in (config.output_dir / "cells").iterdir():
        assert (cell_dir / "work" / "partial.txt").read_text() == str(first.pid)
    assert not lock.exists()  # released (and removed) at the end


def test_a_dead_runs_lock_is_taken_over_with_a_message(tmp_path):
    config = cfg.load_config(write_config(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    config.output_dir.mkdir(parents=True)
    (config.output_dir / ".lock").write_text(json.dumps({"pid": dead_pid, "host": socket.gethostname(),
                                                         "started": "2026-01-01T00:00:00+00:00"}))
    logged, calls = [], []
    assert run_config(config, executor=fake(calls), report=False, log=logged.append) == 0
    assert (f"taking over the lock {config.output_dir / '.lock'} left by process {dead_pid} on host "
            f"{socket.gethostname()}, started 2026-01-01T00:00:00+00:00, which is no longer running") in logged
    assert len(calls) == len(build_plan(config))


def test_shards_share_a_directory_but_a_full_run_or_the_same_shard_is_refused(tmp_path):
    root = tmp_path / "run"
    with RunLock(root, shard="1/2"), RunLock(root, shard="2/2"):
        with pytest.raises(RunLockedError, match=r"in use by process \d+ on host .*shard 1/2"):
            RunLock(root).acquire()
        with pytest.raises(RunLockedError, match="shard 2/2"):
            RunLock(root, shard="2/2").acquire()
    with RunLock(root):
        with pytest.raises(RunLockedError, match=f"process {os.getpid()}"):
            RunLock(root, shard="1/2").acquire()
    with RunLock(root):  # all released
        pass
    assert not list(root.glob(".lock*"))  # and no lock file left behind


@pytest.mark.parametrize("damage, problem", [
    (lambda p: p.write_text('{"status": "ok"}'), "schema_version None is not 1"),
    (lambda p: p.write_text("[1]"), "expected a JSON object, got list"),
    (lambda p: p.write_text('{"schema_version": 1, "status": "ok", "ha'), "unreadable"),
    (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "metrics": None})),
     "field 'metrics' is missing or not a dict"),
    (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "hash": "0" * 16})),
     f"it is the result of cell {'0' * 16}"),
    (lambda p: (p.parent / "run_record.json").write_text("[]"), "expected a JSON object, got list"),
    (lambda p: (p.parent / "run_record.json").unlink(), "its run_record.json is missing"),
])
def test_an_invalid_result_is_named_recomputed_and_never_counted(tmp_path, damage, problem):
    config = cfg.load_config(write_config(tmp_path))
    cells = build_plan(config)
    store = CellStore(config.output_dir, log=lambda *_: None)
    run_cells(cells, store, fake([]), log=lambda *_: None)
    victim = cells[1].hash
    path = store.cell_dir(victim) / "result.json"
    damage(path)
    logged = []
    store = CellStore(config.output_dir, log=logged.append)
    assert not store.is_finished(victim)
    assert len(logged) == 1 and problem in logged[0] and "is not a valid cell file" in logged[0]
    assert str(store.cell_dir(victim)) in logged[0]
    # The report reads the run without crashing, leaving the cell out and saying so on stderr.
    report_log = []
    assert {r["hash"] for r in load_results(config.output_dir, log=report_log.append)} == \
        {c.hash for c in cells} - {victim}
    assert len(report_log) == 1 and problem in report_log[0]
    # A new run recomputes exactly that cell; afterwards all results are valid again.
    calls, logged = [], []
    counts = run_cells(cells, CellStore(config.output_dir, log=logged.append), fake(calls), log=logged.append)
    assert calls == [victim] and counts["skipped"] == len(cells) - 1 and counts["ok"] == 1
    assert any(problem in line for line in logged)
    assert len(load_results(config.output_dir)) == len(cells)


def test_each_computed_cell_says_about_how_long_the_rest_will_take(tmp_path, monkeypatch):
    """A long GPU run tells how far it is: the cells not yet reached at the mean wall time of those computed."""
    import cru_harness.runner.loop as loop

    config = cfg.load_config(write_config(tmp_path))
    cells = build_plan(config)
    assert len(cells) >= 3
    walls = iter([120.0, 360.0] + [60.0] * len(cells))
    real_run_one = loop.run_one

    def timed(*args, **kwargs):
        result, record = real_run_one(*args, **kwargs)
        result["resources"]["cell_wall_time_s"] = next(walls)
        return result, record

    monkeypatch.setattr(loop, "run_one", timed)
    store = CellStore(config.output_dir, log=lambda *_: None)
    run_cells(cells[:1], store, fake([]), log=lambda *_: None)   # finished earlier: no time of this run
    logged = []
    run_cells(cells, store, fake([]), log=logged.append)
    done = [line for line in logged if ": ok in" in line]
    n = len(cells)
    left = n - 2    # the first cell finished earlier; the second is the first computed here, in 360 s
    assert done[0].endswith(f": ok in 360.0s; about {round(left * 6)} min left for {left} more "
                            f"cell{'s' if left > 1 else ''}"), done[0]
    assert done[-1].endswith(": ok in 60.0s")   # the last says nothing more
    one = cells[0]
    assert loop.time_left([(one, 7200.0)], [one, one]) == "; about 4.0 h left for 2 more cells"
    assert loop.time_left([(one, 10.0)], [one]) == "; about 1 min left for 1 more cell"


def test_time_left_counts_each_cell_at_its_kinds_measured_cost():
    """Nine cells left after fast scorings: a fine-tune and NPO trainings are not scorings. Each remaining cell is
    estimated from the cells of its kind (kind, method, attack), then of its kind alone, then from every cell; with
    a reference run (the demo's committed cells), from its own time there at this machine's pace."""
    from types import SimpleNamespace

    from cru_harness.runner import loop

    def cell(name, kind, method, attack=None):
        return SimpleNamespace(hash=name, kind=kind, method=method, extra={"attack": {"name": attack}} if attack else {})

    original, retain = cell("o", "original", "Original"), cell("r", "retain", "Retain")
    npo1, npo2, ga = cell("n1", "method", "NPO"), cell("n2", "method", "NPO"), cell("g", "method", "GA")
    relearn, quantize = cell("a1", "attack", "NPO", "relearn"), cell("a2", "attack", "NPO", "quantize")
    done = [(original, 60.0), (npo1, 900.0), (relearn, 300.0)]
    assert loop.estimate_seconds(npo2, done) == 900.0           # its kind: the NPO cell
    assert loop.estimate_seconds(ga, done) == 900.0             # no GA yet: the method cells
    assert loop.estimate_seconds(quantize, done) == 300.0       # no quantize yet: the attack cells
    assert loop.estimate_seconds(retain, done) == 420.0         # no kind of its own yet: every cell's mean
    assert loop.time_left(done, [npo2, ga, quantize]) == "; about 35 min left for 3 more cells"
    # the mean of all computed cells (the old estimate) would say 21 min for these three
    reference = {"o": 30.0, "n1": 450.0, "n2": 500.0}   # this machine runs at twice the reference's times
    assert loop.estimate_seconds(npo2, done, reference) == 1000.0
    assert loop.estimate_seconds(ga, done, reference) == 900.0   # not in the reference: its kind
    assert loop.time_left([], [npo2]) == "" and loop.time_left(done, []) == ""
    assert loop.time_left([], [npo2], reference) == "; about 8 min left for 1 more cell"   # before any cell: its own


def test_a_recomputation_killed_before_its_result_is_written_is_not_a_finished_cell(tmp_path, monkeypatch):
    """The record is written before the result. A cell recomputed (here --force; also: other code, other inputs)
    and killed between the two used to leave the OLD result beside the NEW record: the next run skipped it as
    finished and the report showed the old numbers as current."""
    import cru_harness.store as cache

    config = cfg.load_config(write_config(tmp_path))
    cells = build_plan(config)[:1]
    store = CellStore(config.output_dir, log=lambda *_: None)
    run_cells(cells, store, fake([]), log=lambda *_: None)
    assert store.is_finished(cells[0].hash)
    real = cache.atomic_write_json

    def killed_at_the_result(path, obj):
        if Path(path).name == "result.json":
            raise KeyboardInterrupt   # what the kill leaves: the record written, the result not
        real(path, obj)

    monkeypatch.setattr(cache, "atomic_write_json", killed_at_the_result)
    with pytest.raises(KeyboardInterrupt):
        run_cells(cells, store, fake([]), log=lambda *_: None, force=True)
    monkeypatch.setattr(cache, "atomic_write_json", real)
    store = CellStore(config.output_dir, log=lambda *_: None)
    assert not store.is_finished(cells[0].hash) and store.was_interrupted(cells[0].hash)
    calls = []
    run_cells(cells, store, fake(calls), log=lambda *_: None)
    assert calls == [cells[0].hash]


def test_written_files_take_the_umask_and_merge_leaves_a_killed_writes_leftovers(tmp_path):
    from cru_harness.store import atomic_write_text
    from cru_harness.runner.cli import merge_dirs

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644   # mkstemp's 0600 hid results from a group
    config = cfg.load_config(write_config(tmp_path))
    cells = build_plan(config)[:1]
    run_cells(cells, CellStore(config.output_dir), fake([]), log=lambda *_: None)
    cell_dir = config.output_dir / "cells" / cells[0].hash
    (cell_dir / ".result.json.abcd1234.tmp").write_text("{")   # a write killed half-way
    merge_dirs([config.output_dir], tmp_path / "merged")
    merged = tmp_path / "merged" / "cells" / cells[0].hash
    assert (merged / "result.json").is_file() and not list(merged.glob(".*.tmp"))
    # recomputing the cell clears it from the cell's own directory
    run_cells(cells, CellStore(config.output_dir), fake([]), log=lambda *_: None, force=True)
    assert not list(cell_dir.glob(".*.tmp"))


def test_a_full_disk_and_ctrl_c_are_one_line_each(tmp_path, monkeypatch, capsys):
    import errno

    import cru_harness.reporting.cli as report_cli
    from cru_harness.cli import main
    from cru_harness.errors import OutputWriteError
    from cru_harness.store import atomic_write_text

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", full)
        with pytest.raises(OutputWriteError, match="cannot write .*a.txt: No space left on device"):
            atomic_write_text(tmp_path / "a.txt", "x")
    assert list(tmp_path.iterdir()) == []   # no temporary file left behind
    config = cfg.load_config(write_config(tmp_path))
    run_cells(build_plan(config), CellStore(config.output_dir), fake([]), log=lambda *_: None)
    capsys.readouterr()
    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", full)
        assert main(["report", str(config.output_dir), "--no-plots", "--formats", "md"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "Traceback" not in err[0]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_cli, "write_report", interrupted)
    assert main(["report", str(config.output_dir)]) == 130
    assert capsys.readouterr().err.strip() == "cru-harness report: interrupted"


def test_the_command_ends_by_sigint_after_ctrl_c_so_a_calling_shell_loop_stops():
    import signal

    interrupted = "import cru_harness.cli as c; c.main = lambda argv=None: c.INTERRUPTED; c.console_main()"
    assert subprocess.run([sys.executable, "-c", interrupted]).returncode == -signal.SIGINT
    other = "import cru_harness.cli as c; c.main = lambda argv=None: 2; c.console_main()"
    assert subprocess.run([sys.executable, "-c", other]).returncode == 2


def test_output_piped_into_a_reader_that_left_ends_quietly_and_other_broken_pipes_stay_bugs():
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line (`| head -0`)
    # a command printing more than stdout's buffer holds, so the write fails inside the command
    printing = "import cru_harness.cli as c\ndef main(argv=None): print('row\\n' * 50000)\n" \
               "c.main = main; c.console_main()"
    proc = subprocess.run([sys.executable, "-c", printing], stdout=write_end, stderr=subprocess.PIPE, text=True)
    os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == ""
    # a broken pipe that is not stdout's (a worker's, a socket's) keeps its traceback
    other = "import cru_harness.cli as c\ndef main(argv=None): raise BrokenPipeError(32, 'a worker')\n" \
            "c.main = main; c.console_main()"
    proc = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "a worker" in proc.stderr


def test_training_commands_other_than_finetune_refuse_several_launched_processes(monkeypatch, capsys, tmp_path):
    """`run` refuses several launched processes; `unlearn --method CRU` too (a weight-training method's trains on
    the engine's processes)."""
    from cru_harness.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")   # what accelerate launch / torchrun set in every process
    missing = str(tmp_path / "missing.yaml")
    assert main(["run", missing]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["cru-harness run: error: runs in one process, and 2 were launched (accelerate launch / "
                   "torchrun: WORLD_SIZE=2); start it without them (finetune and unlearn of a weight-training method "
                   "train data parallel; a runner config trains on several GPUs with `training: {engine, "
                   "num_processes}`)"]
    base = tmp_path / "base"
    base.mkdir()
    assert main(["unlearn", "--method", "CRU", "--base", str(base), "--forget", "forget10", "--retain", "retain90",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--method CRU runs in one process, and 2 were launched" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2   # a command that trains nothing reaches its own check
    assert "WORLD_SIZE" not in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main(["run", missing]) == 2            # alone, it reaches the command (which finds no config)
    assert "missing.yaml" in capsys.readouterr().err


def test_report_command_survives_invalid_results(tmp_path, capsys):
    from cru_harness.cli import main

    config = cfg.load_config(write_config(tmp_path))
    cells = build_plan(config)
    run_cells(cells, CellStore(config.output_dir), fake([]), log=lambda *_: None)
    (config.output_dir / "cells" / cells[0].hash / "result.json").write_text("[1]")
    (config.output_dir / "cells" / cells[1].hash / "result.json").write_text('{"status": "ok"}')
    assert main(["report", str(config.output_dir), "--no-plots", "--formats", "md"]) == 0
    err = capsys.readouterr().err
    for cell in cells[:2]:
        assert f"{config.output_dir / 'cells' / cell.hash / 'result.json'} is not a valid cell file" in err


def test_results_and_records_carry_their_schema_version(tmp_path):
    config = cfg.load_config(write_config(tmp_path))
    cells = build_plan(config)[:1]
    run_cells(cells, CellStore(config.output_dir), fake([]), log=lambda *_: None)
    cell_dir = config.output_dir / "cells" / cells[0].hash
    assert json.loads((cell_dir / "result.json").read_text())["schema_version"] == 1
    assert json.loads((cell_dir / "run_record.json").read_text())["schema_version"] == 1


@pytest.mark.parametrize("below, words", [("", "exists and is not a directory"),
                                          ("run", "is a file, not a directory")])
def test_run_checks_its_output_dir_before_any_work(tmp_path, capsys, below, words):
    from cru_harness.cli import main

    (tmp_path / "file").write_text("x")
    output_dir = tmp_path / "file" / below if below else tmp_path / "file"
    path = write_config(tmp_path, output_dir=str(output_dir))
    assert main(["run", str(path), "--no-report"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cru-harness run: error: output_dir ") and words in err and str(output_dir) in err
    assert not (tmp_path / "run").exists()


def _without_flock(monkeypatch):
    """A file system without flock (some network file systems): every flock call fails with ENOSYS."""
    import fcntl

    def no_flock(fd, operation):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)


def test_without_flock_a_held_lock_is_refused_naming_its_holder(tmp_path, monkeypatch):
    """Some network file systems have no flock: filelock's fallback (a lock file created exclusively) keeps a second
    run out; the message names the recorded holder, and when that process is gone, says to delete the file."""
    _without_flock(monkeypatch)
    root = tmp_path / "run"
    root.mkdir()
    lock = root / ".lock"
    lock.write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))   # alive: our parent
    with pytest.raises(RunLockedError, match=f"in use by process {os.getppid()} .*wait for that run to finish"):
        RunLock(root).acquire()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    with pytest.raises(RunLockedError, match="that process is gone .*delete the lock file"):
        RunLock(root).acquire()
    lock.unlink()
    with RunLock(root):
        with pytest.raises(RunLockedError, match=f"in use by process {os.getpid()}"):
            RunLock(root).acquire()
    assert not lock.exists()


def test_without_flock_an_output_held_elsewhere_is_refused_and_its_lock_kept(tmp_path, monkeypatch):
    """The output lock on a file system without flock: another process's lock file (an existence lock) refuses
    this one, naming its holder, and stays in place (filelock's own fallback deleted it and let this one in)."""
    from cru_harness.locations import OutputLocationError, lock_path, output_lock

    _without_flock(monkeypatch)
    out = tmp_path / "out"
    held = lock_path(out)
    held.write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))   # alive: our parent
    with pytest.raises(OutputLocationError, match=f"is being written by .*{os.getppid()}"):
        with output_lock(out):
            pass
    assert held.is_file()
    held.unlink()
    with output_lock(out):
        assert held.is_file()
    assert not held.exists()


@pytest.mark.parametrize("which", ["waiting_lock", "testbed"])
def test_without_flock_a_waiting_lock_waits_for_the_holder(tmp_path, monkeypatch, which):
    """The run's shared-work lock and the testbed cache's build lock, on a file system without flock: while
    another process's lock file exists, they wait (and leave it in place); once it is gone, they go on."""
    import threading

    from cru_harness.store import waiting_lock
    from cru_harness.testbed import zoo

    _without_flock(monkeypatch)
    held = tmp_path / ".entry.lock"
    held.write_text("another process")
    take = waiting_lock if which == "waiting_lock" else zoo._file_lock
    entered = threading.Event()

    def worker():
        with take(held):
            entered.set()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    assert not entered.wait(1.0), "entered a lock another process holds"
    assert held.read_text() == "another process"
    held.unlink()
    assert entered.wait(10.0)
    thread.join(10.0)


def test_only_runs_the_named_methods_cells_and_keeps_the_plan_whole(tmp_path, capsys):
    """`--only IdkDPO` after a fix to IdkDPO: its cells run, every other cell stays as it is (here: not yet
    run), plan.json still lists the whole plan; a label the config lacks is one line naming its labels."""
    from cru_harness.cli import main

    config = cfg.load_config(write_config(tmp_path, methods=[{"method": "GA"}, {"method": "IdkDPO"}]))
    calls = []
    assert run_config(config, executor=fake(calls), report=False, log=lambda _: None, only="IdkDPO") == 0
    plan = build_plan(config)
    idk = {cell.hash for cell in plan if cell.label == "IdkDPO"}
    assert idk and set(calls) == idk and len(calls) == len(idk)
    recorded = json.loads((config.output_dir / "plan.json").read_text())["cells"]
    assert len(recorded) == len(plan) > len(idk)
    assert main(["run", str(write_config(tmp_path)), "--only", "GA,Nope", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'Nope' is not a method label" in err[0] and "its labels: " in err[0]
    # a dry run with --only lists the cells that would run, and says how many of the plan's they are
    both = write_config(tmp_path, methods=[{"method": "GA"}, {"method": "IdkDPO"}])   # the run's config again
    assert main(["run", str(both), "--only", "IdkDPO", "--dry-run", "--json"]) == 0
    assert {cell["hash"] for cell in json.loads(capsys.readouterr().out)["cells"]} == idk
    assert main(["run", str(both), "--only", "IdkDPO", "--dry-run"]) == 0
    assert f"{len(idk)} of {len(plan)} cells (--only IdkDPO)" in capsys.readouterr().out.splitlines()[0]


def test_an_unknown_only_label_is_refused_before_anything_slow(tmp_path, monkeypatch):
    """`--only` is checked against the config's labels before the testbed models are built (minutes) or anything
    is locked or written; a label the plan only has once RWKU targets are chosen (Original) is known already."""
    from cru_harness.errors import InputError
    from cru_harness.runner import models
    from cru_harness.runner.cli import check_only

    monkeypatch.setattr(models, "prebuild_local_models", lambda *a, **k: pytest.fail("built models before --only"))
    config = cfg.load_config(write_config(tmp_path))
    with pytest.raises(InputError, match=r"--only 'GAA': 'GAA' is not a method label of .*its labels: Original, GA"):
        run_config(config, only="GAA", report=False, log=lambda _: None)
    assert not config.output_dir.exists()
    pending = cfg.load_config(write_config(tmp_path, benchmarks={"rwku": {"targets": "1-3", "select_known": {"top": 1}}},
                                           methods=[{"method": "GA"}]))
    assert check_only("Original,GA", pending) == ["Original", "GA"]
