"""Commands packages add to `cru-harness` (entry-point group `cru_harness.commands`, `plugins.add_commands`): TOFU's
`score` is one, and a command plugin that cannot be used is kept aside in one line without breaking the others."""
from __future__ import annotations

import argparse
import tomllib
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest

from cru_harness import cli, plugins

REPO = Path(__file__).resolve().parents[1]


def test_score_is_tofus_command_through_its_entry_point():
    """The core names no benchmark's command: `score` comes from the entry point pyproject.toml declares (the
    installed copy is this one), and its parser is TOFU's."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][plugins.COMMANDS]
    assert declared == {"score": "cru_harness.benchmarks.tofu.score:add_score_parser"}
    assert {ep.name: ep.value for ep in entry_points(group=plugins.COMMANDS)} == declared
    assert "--retain-logs" in _commands(cli.build_parser())["score"].format_help()


def test_the_core_cli_alone_has_no_score(monkeypatch):
    """Without the command plugins the core's own command modules register no `score` (mutation check of the hook)."""
    monkeypatch.setattr(plugins, "add_commands", lambda subparsers: {})
    assert "score" not in _commands(cli.build_parser()) and "report" in _commands(cli.build_parser())


def _commands(parser) -> dict:
    return next(a for a in parser._actions if a.dest == "command").choices


def _hello(subparsers):
    parser = subparsers.add_parser("hello", help="says hello")
    parser.add_argument("--name", default="world")
    parser.set_defaults(func=lambda args: print(f"hello {args.name}"))


def _nothing(subparsers):
    subparsers.add_parser("other")


def _raises(subparsers):
    raise RuntimeError("the command's own bug")


def _import_fails():
    raise ImportError("no module named 'gone'")


@pytest.fixture
def installed(monkeypatch):
    """Fake command entry points: one that works, and one of each way of being unusable."""
    found = {"hello": _hello, "nothing": _nothing, "raises": _raises, "notcallable": 42, "run": _hello}
    points = [EntryPoint(name, f"thirdparty.cmds:{name}", plugins.COMMANDS) for name in [*found, "gone"]]

    def load(self):
        return _import_fails() if self.name == "gone" else found[self.name]

    monkeypatch.setattr(EntryPoint, "load", load)
    real = plugins.entry_points
    monkeypatch.setattr(plugins, "entry_points",
                        lambda group: points if group == plugins.COMMANDS else real(group=group))


def test_a_broken_command_plugin_is_kept_aside_in_one_line(installed, capsys):
    """Each unusable command answers with one line naming its entry point; the working one and the built-in
    commands run as before (and a plugin cannot take a built-in's name)."""
    assert cli.main(["hello", "--name", "you"]) == 0
    assert capsys.readouterr().out == "hello you\n"
    expected = {
        "gone": "cannot be used: ImportError: \"no module named 'gone'\"; fix or uninstall it",
        "raises": "cannot be used: RuntimeError: \"the command's own bug\"; fix or uninstall it",
        "notcallable": "is not a function add_parser(subparsers) (got int)",
        "nothing": "its add_parser(subparsers) added no `nothing` command",
    }
    for name, why in expected.items():
        assert cli.main([name, "--any", "-h", "args"]) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(
            f"cru-harness {name}: error: command plugin {name!r} (entry point 'thirdparty.cmds:{name}' of an unknown "
            "distribution)") and err.rstrip().endswith(why), err
    assert "--dry-run" in _commands(cli.build_parser())["run"].format_help()   # the built-in keeps its name
    parser = argparse.ArgumentParser(prog="cru-harness")
    subparsers = parser.add_subparsers(dest="command")
    subparsers.add_parser("run")
    broken = plugins.add_commands(subparsers)
    assert set(broken) == {*expected, "run"} and "already a cru-harness command" in broken["run"]
    assert sorted(subparsers.choices) == sorted({"run", "hello", "other", *expected})   # "other": what `nothing` added
