"""The user docs (README.md, docs/*.md) stay true to the code: every fenced command that runs `cru-harness
<subcommand>`, `cru-eval` or `lm_eval` names a subcommand and flags its parser has (what its `--help` lists), and
every relative link resolves to a file (and, with `#anchor`, to a heading of it).

The parsers are built in-process (`cru_harness.cli.build_parser`, lm-eval's `HarnessCLI`), with no subprocess and
no model: the test takes seconds."""
from __future__ import annotations

import argparse
import re
import shlex
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Fenced blocks that hold shell commands: no language, or a shell one (```python blocks are code, not commands).
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
SEPARATORS = {";", "&", "&&", "|", "||"}
FENCE = re.compile(r"^```(\S*)\s*$")
RUNS_A_COMMAND = re.compile(r"^\s*(\w+=\S*\s+)*(cru-harness|cru-eval|lm_eval|lm-eval)\b|-m (cru_harness|lm_eval)\b")
# Words a command may follow on its line: shell keywords, environment assignments (X=1), launchers before `-m`.
PREFIX_WORDS = {"do", "then", "else", "time", "exec", "nohup"}
LAUNCHERS = {"python", "python3", "accelerate", "torchrun"}


def fenced_blocks(text: str) -> list[tuple[str, int, str]]:
    """(language, first line number, body) of each fenced block."""
    blocks, language, start, body = [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line.strip())
        if match and language is None:
            language, start, body = match.group(1).lower(), number + 1, []
        elif line.strip() == "```" and language is not None:
            blocks.append((language, start, "\n".join(body)))
            language = None
        elif language is not None:
            body.append(line)
    return blocks


def shell_commands(body: str) -> list[list[str]]:
    """The simple commands of a shell block: continuation lines joined, comments dropped, split on ; & && | ||."""
    commands = []
    for line in body.replace("\\\n", " ").splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line)   # a comment starts at a word boundary (`a#b` is one word in sh)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        current: list[str] = []
        try:
            for token in lexer:
                if token in SEPARATORS:
                    commands.append(current)
                    current = []
                else:
                    current.append(token)
        except ValueError:   # unbalanced quotes: prose in a block (a file tree), unless it runs a command
            if RUNS_A_COMMAND.search(line):
                commands.append(["<unparsable>", line])
            continue
        commands.append(current)
    return [command for command in commands if command]


@lru_cache(maxsize=None)
def harness_subparsers() -> dict[str, argparse.ArgumentParser]:
    from cru_harness.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@lru_cache(maxsize=None)
def lm_eval_subparsers() -> dict[str, argparse.ArgumentParser]:
    from lm_eval._cli.harness import HarnessCLI

    return dict(HarnessCLI()._subparsers.choices)


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def invocation(tokens: list[str]) -> tuple[str, str | None, list[str]] | None:
    """("cru-harness" | "lm_eval", subcommand, its arguments) when `tokens` runs one of the project's commands
    (directly, through `python -m`, or `accelerate launch -m`), else None. Environment assignments are skipped."""
    if tokens[0] == "<unparsable>":
        return ("unparsable", None, tokens[1:])
    start = 0
    while start < len(tokens) and (tokens[start] in PREFIX_WORDS or re.match(r"\w+=", tokens[start])):
        start += 1
    tokens = tokens[start:]
    if not tokens or (tokens[0] not in LAUNCHERS and tokens[0] not in ("cru-harness", "cru-eval", "lm_eval",
                                                                       "lm-eval")):
        return None   # prose in a block (a file tree), or another program
    for i, token in enumerate(tokens):
        module = tokens[i + 1] if token == "-m" and i + 1 < len(tokens) else None
        if token == "cru-harness" or module == "cru_harness":
            rest = tokens[i + 1 + (module is not None):]
            return ("cru-harness", rest[0] if rest else None, rest[1:])
        if token in ("cru-eval", "lm_eval", "lm-eval") or module == "lm_eval":
            rest = tokens[i + 1 + (module is not None):]
            if rest and rest[0] in lm_eval_subparsers():
                return ("lm_eval", rest[0], rest[1:])
            return ("lm_eval", "run", rest)   # lm-eval inserts `run` when no subcommand is given
    return None


def documented_commands() -> list[tuple[str, tuple[str, str | None, list[str]]]]:
    found = []
    for path in DOCS:
        for language, line, body in fenced_blocks(path.read_text()):
            if language not in SHELL_LANGUAGES:
                continue
            for tokens in shell_commands(body):
                if (call := invocation(tokens)) is not None:
                    found.append((f"{path.relative_to(ROOT)}:{line}", call))
    return found


COMMANDS = documented_commands()


def test_the_docs_name_commands_of_every_kind():
    # the parser below must have something to check: the README's recipes run both programs
    programs = {call[0] for _, call in COMMANDS}
    subcommands = {call[1] for _, call in COMMANDS if call[0] == "cru-harness"}
    assert programs == {"cru-harness", "lm_eval"}, programs
    assert {"unlearn", "finetune", "score", "run", "study", "demo"} <= subcommands, subcommands


@pytest.mark.parametrize("where,call", COMMANDS, ids=[f"{w} {c[0]} {c[1]}" for w, c in COMMANDS])
def test_documented_command_parses(where, call):
    program, subcommand, args = call
    assert program != "unparsable", f"{where}: a command the shell cannot parse (quotes): {args[0]}"
    parsers = harness_subparsers() if program == "cru-harness" else lm_eval_subparsers()
    assert subcommand in parsers, f"{where}: {program} has no subcommand {subcommand!r}"
    known = option_strings(parsers[subcommand])
    flags = [arg.split("=", 1)[0] for arg in args if arg.startswith("-") and arg != "-" and not arg[1:2].isdigit()]
    unknown = [flag for flag in flags if flag not in known]
    assert not unknown, f"{where}: `{program} {subcommand}` has no option {', '.join(unknown)}"


def test_only_commands_are_checked():
    assert invocation(shlex.split("lmeval/  lm-eval integration: the cru model")) is None
    assert invocation(shlex.split("echo cru-harness run --x")) is None
    assert invocation(["do", "CUDA_VISIBLE_DEVICES=0", "cru-harness", "run", "c"]) == ("cru-harness", "run", ["c"])


def test_option_check_catches_an_unknown_flag():
    # the check above is not vacuous: a misspelt flag and subcommand are found
    (_, call), = [(w, c) for w, c in [("x", invocation(shlex.split("cru-harness unlearn --bse m")))]]
    assert "--bse" not in option_strings(harness_subparsers()[call[1]])
    assert invocation(shlex.split("accelerate launch -m lm_eval --model cru")) == ("lm_eval", "run", ["--model", "cru"])
    assert invocation(shlex.split("X=1 python -m cru_harness finetune --lr 1")) == ("cru-harness", "finetune",
                                                                                    ["--lr", "1"])
    assert "nope" not in harness_subparsers()


# ------------------------------------------------------------------------------------------------------ links
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """`text` without fenced blocks and inline code, where a `[x](y)` is no link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters, digits, _ and - kept), spaces -> -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return frozenset(slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M))


def relative_links() -> list[tuple[Path, str]]:
    links = []
    for path in DOCS:
        for target in LINK.findall(prose(path.read_text())):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto: are not checked here
                links.append((path, target))
    return links


LINKS = relative_links()


@pytest.mark.parametrize("path,target", LINKS, ids=[f"{p.name}->{t}" for p, t in LINKS])
def test_relative_link_resolves(path, target):
    file_part, _, anchor = target.partition("#")
    resolved = (path.parent / file_part).resolve() if file_part else path
    assert resolved.exists(), f"{path.relative_to(ROOT)}: link {target} points to no file"
    if anchor and resolved.suffix == ".md":
        assert anchor in anchors(resolved), (f"{path.relative_to(ROOT)}: link {target}: {resolved.name} has no "
                                             f"heading with that anchor")


def test_slug_follows_github():
    assert slug("The demo (`results/demo/`)") == "the-demo-resultsdemo"
    assert slug("Several GPUs or machines: shards") == "several-gpus-or-machines-shards"
    assert slug("`lm_eval` and cru-eval") == "lm_eval-and-cru-eval"


# ------------------------------------------------------------------------------------------------------ cli.md
CLI_DOC = ROOT / "docs" / "cli.md"
LISTINGS = ("methods", "benchmarks", "attacks")   # one row of cli.md's table for the three registry listings


def cli_sections() -> dict[str, str]:
    """`## <name>` section of docs/cli.md -> its prose (fenced blocks dropped: their commands are checked above)."""
    parts = re.split(r"^## ", CLI_DOC.read_text(), flags=re.M)[1:]
    return {part.split("\n", 1)[0].strip(): re.sub(r"^```.*?^```", "", part, flags=re.S | re.M) for part in parts}


def test_cli_doc_has_a_section_for_every_subcommand():
    """docs/cli.md says it covers every subcommand: each parser has its row in the table and its section (the three
    listings share one row), and each section is a subcommand's (or lm-eval's)."""
    sections = cli_sections()
    table = CLI_DOC.read_text().split("\n## ", 1)[0]
    for name in harness_subparsers():
        assert f"`{name}`" in table, f"docs/cli.md: no row for `cru-harness {name}` in the table"
        assert name in sections or name in LISTINGS, f"docs/cli.md: no `## {name}` section"
    assert set(sections) - set(harness_subparsers()) == {"lm_eval and cru-eval"}


def test_cli_doc_names_only_options_its_commands_have():
    """Every `--option` a section of docs/cli.md names in inline code is one of its subcommand's options (or
    lm-eval's, which the sections point to): a renamed or removed flag fails here."""
    lm_eval = option_strings(lm_eval_subparsers()["run"])
    for name, prose_text in cli_sections().items():
        known = option_strings(harness_subparsers()[name]) if name in harness_subparsers() else set()
        named = set()
        for code in re.findall(r"`([^`\n]*)`", prose_text):
            if re.match(r"(lm_eval|cru-eval|lm-eval)\b", code):
                continue   # an lm-eval command line: the fenced-command check above covers the documented ones
            call = re.match(r"cru-harness ([\w-]+)", code)
            flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?![\w])", code))
            if call:   # `cru-harness <other> --flag`: that subcommand's
                assert flags <= option_strings(harness_subparsers()[call.group(1)]), (name, code)
            else:
                named |= flags
        unknown = named - known - lm_eval
        assert not unknown, f"docs/cli.md, section {name}: no option {', '.join(sorted(unknown))}"


# ------------------------------------------------------------------------------------------------------ times
def test_the_demos_stated_times_are_the_measured_ones():
    """README.md and docs/cli.md quote the committed demo run's times as benchmarks/stated_times.py reads them from
    its run records, with the thread count, and its saved output (benchmarks/results/stated_times.json) holds the
    same: a rerun of the demo that changes them changes the docs with it."""
    import json

    from conftest import load_benchmark

    measured = load_benchmark("stated_times").committed()
    saved = json.loads((ROOT / "benchmarks" / "results" / "stated_times.json").read_text())["committed"]
    assert saved == measured
    cells = f"{measured['cells_minutes']} min"
    selection = f"{measured['target_selection_seconds'][0] / 60:.1f} min"
    assert measured["torch_threads"] == [1]
    for doc in ("README.md", "docs/cli.md"):
        text = " ".join((ROOT / doc).read_text().split())
        assert f"target selection took {selection}" in text and f"cells {cells}, at one torch thread" in text, doc


def test_the_quickstarts_measured_times_are_the_scripts():
    """README's quickstart table quotes benchmarks/results/stated_times.json's measurement of each step."""
    import json

    saved = json.loads((ROOT / "benchmarks" / "results" / "stated_times.json").read_text())
    steps = {row["step"]: row["seconds"] for row in saved["quickstart"]}
    steps["first use"] = saved["first_use"]["seconds"]
    readme = (ROOT / "README.md").read_text()
    for step, seconds in steps.items():
        shown = f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{step}`") or
                   line.startswith(f"| {step} only"))
        assert row.rstrip().endswith(f"| {shown} |"), (step, row)
