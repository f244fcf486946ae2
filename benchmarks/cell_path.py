"""Follow one runner cell through execute_cell (issue 75's measure), on this code and on earlier revisions, in one run.

At run time (`--trace`): every Python call of the project's code that receives the cell object (or a copy of it) as
an argument, in order, by module, while `execute_cell` runs the GA cell of a config once. Statically: every call
site that passes the cell on (the name holding it, or `ctx.cell`), followed from `runner.execute.execute_cell`
through the functions it reaches, each expanded once, in source order; a call on a plugin (`plugin.score(cell)`)
is counted as a call into `cru_harness.api`, which declares the hook, since the plugin is known only at run time.
For both: the calls, the modules, and the re-entries (a call into a module the path had already left, i.e. seen
before but not the module of the previous such call).

    python benchmarks/cell_path.py configs/ci_minimal.yaml --before 4041b5a --out benchmarks/results/cell_path.md

An earlier revision is read from git (`git archive`, into a temporary folder) and traced in a subprocess that
imports it instead of this checkout (its own entry points, so its own plugins)."""
from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------- the path at run time
def trace(config_path: str) -> dict:
    """The calls that receive the GA cell of `config_path` while `execute_cell` runs it, in order."""
    from cru_harness.runner import config as cfg
    from cru_harness.runner.execute import execute_cell
    from cru_harness.runner.plan import build_plan

    config = cfg.load_config(config_path, {"output_dir": tempfile.mkdtemp()})
    cell = next(c for c in build_plan(config) if c.kind == "method" and c.method == "GA")
    trail: list[str] = []

    def profiler(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if any(type(frame.f_locals.get(n)).__name__ == "Cell" for n in names):   # the cell, or a copy of it
            module = frame.f_globals.get("__name__", "?")
            if module.startswith("cru_harness"):
                trail.append(f"{module.removeprefix('cru_harness.')}:{code.co_name}")

    workdir = Path(tempfile.mkdtemp())
    sys.setprofile(profiler)
    try:
        execute_cell(cell, workdir)
    finally:
        sys.setprofile(None)
    return counted(trail)


def counted(trail: list[str]) -> dict:
    modules = [t.split(":")[0] for t in trail]
    left, reentries, prev, into = set(), 0, None, {}
    for m in modules:
        if m != prev:
            if m in left:
                reentries += 1
                into[m] = into.get(m, 0) + 1
            if prev is not None:
                left.add(prev)
        prev = m
    return {"calls": len(trail), "modules": len(set(modules)), "reentries": reentries, "reentered": into,
            "trail": trail}


# ------------------------------------------------------------------------------------------- the path in the source
class Source:
    """The project's modules under `root` (a checkout), parsed: module name -> its functions and imports."""

    def __init__(self, root: Path):
        self.root = root
        self.modules: dict[str, ast.Module] = {}
        for path in sorted((root / "cru_harness").rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            self.modules[name] = ast.parse(path.read_text())
        self.packages = {n for n in self.modules
                         if (root / Path(*n.split("."))).is_dir()}
        api = self.modules.get("cru_harness.api")
        self.hooks = {f.name for c in (api.body if api else []) if isinstance(c, ast.ClassDef)
                      for f in c.body if isinstance(f, ast.FunctionDef)}

    def functions(self, module: str) -> dict[str, ast.FunctionDef]:
        """Module-level functions and methods (as `Class.method` and, for lookups by bare name, `method`)."""
        found: dict[str, ast.FunctionDef] = {}
        for node in self.modules[module].body:
            if isinstance(node, ast.FunctionDef):
                found[node.name] = node
            elif isinstance(node, ast.ClassDef):
                found[node.name] = node   # a class: a call constructs it
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        found[f"{node.name}.{item.name}"] = item
        return found

    def absolute(self, module: str, level: int, name: str | None) -> str:
        base = module.split(".") if module in self.packages else module.split(".")[:-1]
        base = base[:len(base) - (level - 1)] if level else []
        return ".".join(base + ([name] if name else [])) if level else (name or "")

    def imported(self, module: str, function: ast.AST) -> dict[str, tuple[str, str | None]]:
        """Names bound by imports at module level and inside `function`: name -> (module, attribute or None)."""
        bound: dict[str, tuple[str, str | None]] = {}
        for scope in (self.modules[module], function):
            for node in ast.walk(scope):
                if isinstance(node, ast.ImportFrom):
                    source = self.absolute(module, node.level, node.module)
                    for alias in node.names:
                        full = f"{source}.{alias.name}"
                        bound[alias.asname or alias.name] = (full, None) if full in self.modules else (source, alias.name)
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        bound[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
        return bound


def passes(arg: ast.AST, held: set[str]) -> bool:
    """Whether an argument expression is the cell: a name holding it, or a context's `.cell`."""
    return (isinstance(arg, ast.Name) and arg.id in held) or (isinstance(arg, ast.Attribute) and arg.attr == "cell")


def static_path(root: Path) -> dict:
    """Every call site passing the cell on, from `runner.execute.execute_cell`, each function expanded once."""
    source = Source(root)
    trail: list[str] = []
    expanded: set[tuple[str, str]] = set()

    def resolve(module: str, function: ast.AST, call: ast.Call) -> tuple[str, str] | None:
        bound = source.imported(module, function)
        target = call.func
        if isinstance(target, ast.Name):
            if target.id in source.functions(module):
                return module, target.id
            if target.id in bound:
                where, attr = bound[target.id]
                return (where, attr) if attr and where in source.modules else None
            return None
        if isinstance(target, ast.Attribute):
            base = target.value
            if isinstance(base, ast.Name) and base.id in bound and bound[base.id][1] is None:
                where = bound[base.id][0]   # module.function
                return (where, target.attr) if where in source.modules else None
            if isinstance(base, ast.Name) and base.id == "self":
                return None   # a method of the same object: resolved below by bare name when it is in the module
            if target.attr in source.hooks:   # a plugin's hook: known at run time only
                return "cru_harness.api", target.attr
        return None

    def walk(module: str, name: str, held: set[str]) -> None:
        if (module, name) in expanded or module not in source.modules:
            return
        expanded.add((module, name))
        functions = source.functions(module)
        node = functions.get(name)
        if node is None:
            node = next((f for key, f in functions.items() if key.endswith(f".{name}")), None)
        if isinstance(node, ast.ClassDef):
            return   # a constructor: the object holds the cell from here (`ctx.cell`)
        if node is None:
            return
        for call in sorted((n for n in ast.walk(node) if isinstance(n, ast.Call)),
                           key=lambda n: (n.lineno, n.col_offset)):
            positions = [i for i, a in enumerate(call.args) if passes(a, held)]
            keywords = [k.arg for k in call.keywords if k.arg and passes(k.value, held)]
            if not positions and not keywords:
                continue
            target = resolve(module, node, call)
            if target is None:
                if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and \
                        call.func.value.id == "self" and call.func.attr in {k.split(".")[-1] for k in functions}:
                    target = (module, call.func.attr)
                else:
                    continue   # a library's function (dataclasses.replace, a logger): not the project's path
            where, what = target
            trail.append(f"{where.removeprefix('cru_harness.')}:{what}")
            callee = source.functions(where).get(what) if where in source.modules else None
            if callee is None and where in source.modules:
                callee = next((f for key, f in source.functions(where).items() if key.endswith(f".{what}")), None)
            if isinstance(callee, ast.FunctionDef):
                params = [a.arg for a in callee.args.posonlyargs + callee.args.args]
                if params and params[0] in ("self", "cls") and isinstance(call.func, ast.Attribute):
                    params = params[1:]
                names = {params[i] for i in positions if i < len(params)} | set(keywords)
                walk(where, what, names or {"cell"})

    trail.append("runner.execute:execute_cell")
    walk("cru_harness.runner.execute", "execute_cell", {"cell"})
    return counted(trail)


# ------------------------------------------------------------------------------------------- earlier revisions
def checkout(rev: str, into: Path) -> Path:
    """The tree of `rev` in `into`, with a dist-info of its own entry points (its plugins, not this checkout's)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    project = tomllib.loads((into / "pyproject.toml").read_text())["project"]
    info = into / f"cru_harness-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: cru_harness\nVersion: {project['version']}\n")
    lines = []
    for group, points in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in points.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines))
    return into


def trace_elsewhere(root: Path, config: str) -> dict:
    """`trace` run on the code under `root`, in a subprocess that imports it."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), config, "--trace"], cwd=root, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"tracing {root} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def head() -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def report(config: str, before: list[str], rows: list[tuple[str, dict, dict]]) -> str:
    lines = ["# The path of one cell through `execute_cell`", "",
             f"`python benchmarks/cell_path.py {config}{''.join(f' --before {rev}' for rev in before)} "
             "--out benchmarks/results/cell_path.md`, in one run: the GA cell of the config run once by each "
             "revision's code (an earlier one in a subprocess importing it), and each revision's source read. "
             "At run time: every call of the project's code that receives the cell (or a copy of it), in order. "
             "In the source: every call site that passes the cell on, followed from `execute_cell`, each function "
             "expanded once; a plugin's hook counts as a call into `api`. A re-entry is a call into a module the "
             "path had already left. The goal (issue 75): at most half the re-entries of before. (The issue's "
             "82 calls in 29 modules, 53 re-entries, followed the cell into the plugins too; the source count "
             "here stops at the hook.)", "",
             "| code | run time: calls | modules | re-entries | source: calls | modules | re-entries |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, ran, read in rows:
        lines.append(f"| {name} | {ran['calls']} | {ran['modules']} | {ran['reentries']} | {read['calls']} | "
                     f"{read['modules']} | {read['reentries']} |")
    lines.append("")
    for name, ran, read in rows:
        lines += [f"## {name}", "", "Run time: " + " → ".join(ran["trail"]), "",
                  "Re-entered at run time: " + (", ".join(f"`{m}` {n}" for m, n in sorted(ran["reentered"].items()))
                                                or "none"),
                  "", "Re-entered in the source: " + (", ".join(f"`{m}` {n}" for m, n in
                                                                sorted(read["reentered"].items())) or "none"), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("--trace", action="store_true", help="print this code's run-time trace as JSON and stop")
    parser.add_argument("--before", action="append", default=[], help="an earlier revision to measure beside")
    parser.add_argument("--out", help="write the markdown report here (default: print it)")
    args = parser.parse_args()
    if args.trace:
        print(json.dumps(trace(args.config)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rev in args.before:
            root = checkout(rev, Path(tmp) / rev)
            t0 = time.perf_counter()
            rows.append((f"{rev} (before)", trace_elsewhere(root, args.config), static_path(root)))
            print(f"{rev}: traced in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    rows.append((f"{head()} (this code)", trace_elsewhere(REPO, args.config), static_path(REPO)))
    text = report(args.config, args.before, rows)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
