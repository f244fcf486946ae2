"""`cru-harness` entry point. Each package registers its own subcommands; heavy imports stay inside them."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import sys

from cru_harness.arguments import CLIError, config_defaults_help, field_defaults, given_fields  # noqa: F401
from cru_harness.errors import WRITE_ERRNOS, OutputWriteError, UserError, report_user_error

# Modules exposing `register(subparsers)`; each subcommand sets `func` on its parser.
SUBCOMMAND_MODULES = (
    "cru_harness.cru.cli",        # unlearn, inspect
    "cru_harness.finetune.cli",   # finetune
    "cru_harness.reporting.cli",  # report
    "cru_harness.runner.cli",     # run, merge, demo
    "cru_harness.studies.cli",    # study
    "cru_harness.plugin_cli",     # methods, benchmarks, attacks
    "cru_harness.attacks.cli",    # attack
)


#: Subcommands that resume where an interrupted run stopped.
RESUMABLE = ("run", "study", "demo")
#: Subcommands that train in one process: under `accelerate launch` / torchrun every process would train all of
#: it again (`finetune` and `unlearn` of a weight-training method train data parallel, FSDP or ZeRO-3: the
#: training engine's; `unlearn` of CRU refuses several processes itself; the others, which train nothing, run).
ONE_PROCESS = ("run", "study", "demo", "attack")
#: `main`'s status after Ctrl-C (128 + SIGINT, what a shell reports for a process SIGINT ended).
INTERRUPTED = 130


def check_process_count(command: str) -> None:
    """Refuses a `ONE_PROCESS` subcommand under `accelerate launch` / torchrun with several processes."""
    from cru_harness.devices import launched_processes

    if command in ONE_PROCESS and (n := launched_processes()) > 1:
        raise CLIError(f"runs in one process, and {n} were launched (accelerate launch / torchrun: WORLD_SIZE={n}); "
                       "start it without them (finetune and unlearn of a weight-training method train data "
                       "parallel; a runner config trains on several GPUs with `training: {engine, num_processes}`)")


@contextlib.contextmanager
def library_progress_bars(shown: bool):
    """`--no-progress` hides the libraries' bars too (transformers' "Loading weights", the Hub's downloads), and
    they are shown again afterwards (`main` may be called in-process)."""
    if shown:
        yield
        return
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    was_hidden = (are_progress_bars_disabled(), not transformers_logging.is_progress_bar_enabled())
    disable_progress_bars()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not was_hidden[0]:
            enable_progress_bars()
        if not was_hidden[1]:
            transformers_logging.enable_progress_bar()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cru-harness",
        description="Causal Routing for Unlearning, and TOFU/RWKU scored under one protocol.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name == name:  # that package has no CLI yet
                continue
            raise
        module.register(subparsers)
    from cru_harness.plugins import add_commands

    add_commands(subparsers)   # the commands packages add (a benchmark's own, as TOFU's `score`)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        check_process_count(args.command)
        with library_progress_bars(not getattr(args, "no_progress", False)):
            return int(args.func(args) or 0)
    except UserError as err:
        # Bad input (every error type the project raises for it derives from UserError) is reported plainly;
        # anything else is a bug, or a library's own failure, and keeps its traceback.
        report_user_error(f"cru-harness {args.command}", err)
        return 2
    except OSError as err:
        # The disk or quota full, a read-only file system, a permission: the machine's, not the code's (one line);
        # other OS errors are bugs until shown otherwise and keep their traceback.
        if err.errno not in WRITE_ERRNOS:
            raise
        where = f"{err.filename}: " if err.filename else ""
        report_user_error(f"cru-harness {args.command}", OutputWriteError(f"{where}{err.strerror}"))
        return 2
    except KeyboardInterrupt:
        # Ctrl-C is the user's stop, not a bug: one line (files are written whole, so what finished is kept)
        hint = "; the same command resumes from the cells already done" if args.command in RESUMABLE else ""
        print(f"cru-harness {args.command}: interrupted{hint}", file=sys.stderr)
        return INTERRUPTED


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on its write end)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or stdout without a descriptor
        return False


def console_main() -> None:
    """The `cru-harness` command: `main`, and after Ctrl-C (its line printed) the process ends by SIGINT, as an
    uncaught KeyboardInterrupt would end it, so that a calling shell loop stops too instead of going on. Output
    piped into a reader that stops early (`| head`) ends quietly, as other command-line tools do."""
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        if not stdout_reader_gone():  # another pipe than stdout's: a bug, with its traceback
            raise
        import os

        # Python's recipe: stdout onto devnull, so that the interpreter's own flush at exit cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)  # 128 + SIGPIPE, what a shell reports for a writer its pipe ended
    if status == INTERRUPTED:
        import os
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(status)


if __name__ == "__main__":
    # Run through the imported module so its CLIError is the one subcommands raise.
    from cru_harness.cli import console_main as _console_main

    _console_main()
