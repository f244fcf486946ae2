"""A training run on several processes through `accelerate launch`: the runner's `training:` block.

`training: {engine: ddp | fsdp | zero3, num_processes: N, config_file: PATH}` in a runner config trains each of its
weight-training cells as `accelerate launch --config_file <engine's config> --num_processes N -m
cru_harness.training.launch SPEC`: the child processes call the cell's training function (`target`, a
`module:function` name, with the keyword arguments in SPEC, a JSON file) and the main one writes the record the
function saves; the runner then evaluates the saved model as any other. `engine: none` (the default) trains in
the runner's own process, as before.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import InputError

#: engine -> the accelerate config shipped with the package (configs/accelerate/)
ENGINES = {"none": None, "ddp": "ddp.yaml", "fsdp": "fsdp.yaml", "zero3": "zero3.yaml"}


@dataclasses.dataclass(frozen=True)
class LaunchSettings:
    """How a training cell runs: `engine` (none, ddp, fsdp, zero3), `num_processes` (one per GPU), and an
    accelerate `config_file` of one's own instead of the engine's. Validates itself (as PEFT's LoraConfig)."""

    engine: str = "none"
    num_processes: int = 1
    config_file: str | None = None

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise InputError(f"training.engine {self.engine!r}: choose one of {', '.join(ENGINES)}")
        if isinstance(self.num_processes, bool) or not isinstance(self.num_processes, int) or self.num_processes < 1:
            raise InputError(f"training.num_processes {self.num_processes!r}: expected an integer >= 1")
        if self.engine == "none" and (self.num_processes != 1 or self.config_file):
            raise InputError("training.num_processes / config_file need an engine (ddp, fsdp or zero3)")
        if self.config_file is not None and not isinstance(self.config_file, str):
            raise InputError(f"training.config_file {self.config_file!r}: expected a path")

    @classmethod
    def from_dict(cls, values: dict | None) -> "LaunchSettings":
        values = dict(values or {})
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise InputError(f"training: unknown key(s) {unknown}; valid: engine, num_processes, config_file")
        return cls(**values)

    @property
    def launches(self) -> bool:
        return self.engine != "none"

    def accelerate_config(self) -> str:
        """The accelerate config file: the one given, else the package's for the engine."""
        if self.config_file:
            return self.config_file
        import importlib.resources

        return str(importlib.resources.files("cru_harness.configs").joinpath("accelerate", ENGINES[self.engine]))

    def command(self, spec: str | os.PathLike = "SPEC") -> list[str]:
        """The command line that trains one cell (`--dry-run` shows it)."""
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", self.accelerate_config(),
                "--num_processes", str(self.num_processes), "--mixed_precision", "no",
                "-m", "cru_harness.training.launch", str(spec)]


def launch(settings: LaunchSettings, target: str, kwargs: dict, *, log_dir: str | os.PathLike | None = None) -> None:
    """Run `target(**kwargs)` (`module:function`; the kwargs JSON-serialisable) under `accelerate launch` as
    `settings` say, and wait. A failed child is a RuntimeError carrying the end of its output."""
    with tempfile.TemporaryDirectory(prefix="cru_launch_", dir=log_dir) as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"target": target, "kwargs": kwargs}))
        proc = subprocess.run(settings.command(spec), capture_output=True, text=True,
                              env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    if proc.returncode != 0:
        raise RuntimeError(f"accelerate launch ({settings.engine}, {settings.num_processes} processes) of {target} "
                           f"failed with exit code {proc.returncode}:\n{proc.stderr[-4000:]}")


def main(argv: list[str] | None = None) -> int:
    """In each launched process: the spec's function with its keyword arguments."""
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    module, _, name = spec["target"].partition(":")
    getattr(importlib.import_module(module), name)(**spec["kwargs"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
