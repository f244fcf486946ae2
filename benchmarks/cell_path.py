"""Follow one runner cell through execute_cell (issue 75's measure, traced at run time): every Python call that receives the cell object as an argument,
in order, by module; count the calls, the modules, and the re-entries (a call into a module the path had already
left, i.e. seen before but not the module of the previous such call)."""
import json
import sys
import tempfile
from pathlib import Path

from cru_harness.runner import config as cfg
from cru_harness.runner.plan import build_plan
from cru_harness.runner.execute import execute_cell

# usage: python benchmarks/cell_path.py configs/ci_minimal.yaml > out.json   (the GA cell of the config)
config = cfg.load_config(sys.argv[1], {"output_dir": tempfile.mkdtemp()})
cells = build_plan(config)
cell = next(c for c in cells if c.kind == "method" and c.method == "GA")
trail = []


def profiler(frame, event, arg):
    if event != "call":
        return
    code = frame.f_code
    if code.co_argcount + code.co_kwonlyargcount == 0:
        return
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    if any(type(frame.f_locals.get(n)).__name__ == "Cell" for n in names):   # the cell, or a copy of it
        module = frame.f_globals.get("__name__", "?")
        if module.startswith("cru_harness"):
            trail.append(f"{module}:{code.co_name}")


workdir = Path(tempfile.mkdtemp())
sys.setprofile(profiler)
try:
    execute_cell(cell, workdir)
finally:
    sys.setprofile(None)
modules = [t.split(":")[0] for t in trail]
left, reentries, prev = set(), 0, None
for m in modules:
    if m != prev:
        if m in left:
            reentries += 1
        if prev is not None:
            left.add(prev)
    prev = m
print(json.dumps({"calls": len(trail), "modules": len(set(modules)), "reentries": reentries,
                  "trail": trail}, indent=1))
