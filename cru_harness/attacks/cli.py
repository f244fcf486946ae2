"""`cru-harness attack`: one registered attack on one model, outside a run; `cru-harness lens`: the logit lens.

    cru-harness attack --attack quantize --model DIR [--routers DIR] --out DIR --set weights=int8

The attacked model (and the routers to serve with it) are written under `--out` with `attack_record.json`
(the attack, its settings, what it recorded); evaluate it as any model (`cru-eval --model cru`, with
`routers=` when the record names them). A run's `attacks:` block does the same for every method cell and
evaluates each attacked model with the attacked cell's tasks.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from types import SimpleNamespace

from ..devices import add_device_arguments
from ..errors import InputError
from ..prompts import add_prompt_format_argument, prompt_format_label

RECORD_FILE = "attack_record.json"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "attack", help="apply a registered attack (quantize, relearn, detach, ...) to one model",
        description="Apply one attack to a model (for CRU: the base and its --routers) and save the attacked model; "
                    "`cru-harness attacks` lists the attacks and their settings.")
    p.add_argument("--attack", required=True, help="a registered attack's name")
    p.add_argument("--model", required=True, help="the model as deployed: a HF id, a local checkpoint directory or a "
                                                  "testbed name (zoo:llama:finetuned, smollm2)")
    p.add_argument("--routers", default=None, help="router bundle directory (dir+dir for several) served with it")
    p.add_argument("--out", required=True, help="directory for the attacked model and attack_record.json")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                   help="an attack setting (a YAML value), repeatable: --set weights=int8 --set slice_size=10")
    p.add_argument("--forget-corpus", default=None,
                   help="forget corpus of an attack that trains on it (relearn): a TOFU config, JSON/JSONL, rwku:...")
    p.add_argument("--benchmark", default="tofu", choices=("tofu", "rwku"), help="whose prompt format rows take")
    p.add_argument("--data-dir", default=None,
                   help="local TOFU/RWKU data root or testbed:world (default: env or the Hub)")
    p.add_argument("--seed", type=int, default=0, help="seed of a seeded attack (relearn's slice) (default 0)")
    add_prompt_format_argument(p)
    add_device_arguments(p)
    p.set_defaults(func=run_attack)

    lens = subparsers.add_parser(
        "lens", help="logit lens: per layer, the probability of the answers read through the final norm and head",
        description="For each decoder block, TOFU's answer probability when the final norm and output head read "
                    "that block's output (with --routers: the bundle attached, as served). A forgotten answer "
                    "still readable at a middle layer is hidden, not removed (docs/protocol.md, Attacks).")
    lens.add_argument("--model", required=True, help="HF model id, local checkpoint directory or testbed name "
                                                     "(zoo:llama:finetuned, smollm2)")
    lens.add_argument("--routers", default=None, help="router bundle directory (dir+dir for several) to attach")
    lens.add_argument("--data", required=True, help="question-answer rows: a TOFU config, JSON/JSONL, rwku:...")
    lens.add_argument("--data-dir", default=None,
                      help="local TOFU/RWKU data root or testbed:world (default: env or the Hub)")
    lens.add_argument("--limit", type=int, default=None, help="first N rows only")
    lens.add_argument("--json", default=None, metavar="FILE", help="also write the scores to FILE")
    add_prompt_format_argument(lens)
    add_device_arguments(lens)
    lens.set_defaults(func=run_lens)


def parse_settings(pairs: list[str], attack) -> dict:
    """`KEY=VALUE` pairs -> the attack's settings (YAML values), checked by its config dataclass."""
    from ..errors import excerpt
    from ..yamlfile import load_value

    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {excerpt(pair, 80)}: write KEY=VALUE")
        if key.strip() in settings:
            raise InputError(f"--set {excerpt(key.strip(), 80)} is given twice: give it once")
        settings[key.strip()] = load_value(value, f"--set {excerpt(key.strip(), 80)}")
    unknown = sorted(set(settings) - set(attack.settings()))
    if unknown:
        allowed = ", ".join(attack.settings()) or "none"
        raise InputError(f"--set {unknown[0]}: not a setting of attack {attack.name} (its settings: {allowed})")
    attack.check_settings(settings)
    return settings


def model_argument(model: str) -> str:
    """`--model` as every command reads it: a testbed name (`zoo:llama`, `smollm2`) resolved, a local path checked
    (`locations.check_model_path`), a Hub id as it is; an unknown testbed name is one line."""
    from ..locations import check_model_path
    from ..testbed.names import resolve_model_path

    try:
        return check_model_path(resolve_model_path(model), what="--model")
    except (KeyError, ValueError) as err:
        if isinstance(err, InputError):
            raise
        raise InputError(f"--model {model!r}: not a testbed model ({err})") from None


def check_output_file(path: str, what: str) -> None:
    """A file a command writes at the end (`--json`): its directory must exist and be writable, and the path must
    not be a directory, found before any model is loaded."""
    from ..locations import OutputLocationError

    target = Path(path).expanduser()
    if target.is_dir():
        raise OutputLocationError(f"{what} {path} is a directory: give a file name")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise OutputLocationError(f"{what} {path}: its directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or target.exists() and not os.access(target, os.W_OK):
        raise OutputLocationError(f"{what} {path} cannot be written (permission denied)")


def check_attack_inputs(args: argparse.Namespace, attack, settings: dict, on_prompts: bool) -> None:
    """What the attack reads, checked up front: each router bundle of --routers (manifest, weights, digest), the
    forget corpus (it exists and parses), and the slice the settings draw from it (not larger than the corpus)."""
    if args.routers is not None:
        from ..cru.bundle import RouterBundle

        for directory in str(args.routers).split("+"):
            if not directory.strip():
                raise InputError(f"--routers {args.routers!r}: an empty bundle path")
            RouterBundle.from_pretrained(directory.strip())
    if args.forget_corpus is None or on_prompts or "slice_fraction" not in attack.settings():
        return
    from ..data.corpora import load_corpus_rows
    from ..data.slices import forget_slice

    rows, source = load_corpus_rows(args.forget_corpus, args.data_dir)
    config = attack.config(**settings) if attack.config is not None else None
    if getattr(config, "corpus", None) is None:   # a relearn on the forget rows themselves: the slice must fit
        forget_slice(len(rows), fraction=getattr(config, "slice_fraction"), size=getattr(config, "slice_size", None),
                     seed=args.seed, what=f"attack {attack.name} on {source}")


def run_attack(args: argparse.Namespace) -> int:
    from ..locations import command_output_lock

    with command_output_lock(args.out):   # one attack at a time writes --out
        return _run_attack(args)


def _run_attack(args: argparse.Namespace) -> int:
    from .. import plugins
    from ..api import CellContext
    from ..devices import load_causal_lm, resolve_device
    from ..hparams import check_seed
    from ..locations import check_output_dir
    from ..testbed.names import prompt_format_for, resolve_data_dir

    attack = plugins.attacks.get(args.attack)
    settings = parse_settings(args.settings, attack)
    check_seed(args.seed)
    out = check_output_dir(args.out, what="--out", overwrite=args.overwrite)
    # auto: the format the model learned (its training record; plain for a zoo model), else its chat template
    fmt = prompt_format_for(args.prompt_format, args.model, args.benchmark)
    fmt.setdefault("preset", None)
    model_path = model_argument(args.model)   # a testbed name: its directory; args.model stays the name (records)
    data_dir = resolve_data_dir(args.data_dir)
    model_spec = SimpleNamespace(path=model_path, device_map=args.device_map, trust_remote_code=False)
    cell = SimpleNamespace(kind="attack", method=None, benchmark=args.benchmark, split=None, target=None,
                           seed=args.seed, hparams={}, corpora={"forget_corpus": args.forget_corpus}, model=model_spec,
                           extra={"attack": {"name": attack.name, "settings": settings}}, device=args.device,
                           evaluation={})
    # an attack on the prompts names task variants: it leaves the model as it is and needs no forget corpus
    variant = attack.tasks(("tofu_forget10",), settings)[0]
    on_prompts = variant != "tofu_forget10"
    if args.forget_corpus is None and "slice_fraction" in attack.settings() and not on_prompts:
        raise InputError(f"attack {attack.name} trains on forget rows: give --forget-corpus")
    check_attack_inputs(args, attack, settings, on_prompts)   # before any model loads or --out is made
    device = str(resolve_device(args.device)) if args.device_map is None else args.device
    outcome = {"resources": {}, "details": {}, "artifacts": {}}
    ctx = CellContext(cell=cell, model_path=model_path, workdir=out, data_dir=data_dir, outcome=outcome,
                      chat=bool(fmt.get("chat")), prompt_format={k: v for k, v in fmt.items() if v is not None},
                      dtype=args.dtype, device=device, routers=args.routers,
                      load_model=lambda path: load_causal_lm(path, device=device, device_map=args.device_map,
                                                             dtype=args.dtype))
    out.mkdir(parents=True, exist_ok=True)
    attacked = plugins.check_trained(attack.run(ctx), attack, "attack")
    # the format the attacked model is prompted with (what relearn trained on): `--prompt-format auto` reads it
    label = prompt_format_label(fmt, _tokenizer(model_path) if fmt.get("chat") is None else None)
    record = {"attack": attack.name, "settings": settings, "model": args.model, "routers": args.routers,
              "attacked_model": attacked.model_path, "attacked_routers": attacked.routers, "seed": args.seed,
              "prompt_format": label, **outcome}
    if on_prompts:
        metadata = plugins.benchmarks.get(args.benchmark).variant_metadata(
            attack.variant, attack.task_metadata(settings, args.seed))   # in the keys its task variants read
        record["evaluate_with"] = {"tasks_example": variant, "metadata": metadata}
    from ..store import atomic_write_text

    atomic_write_text(Path(out) / RECORD_FILE, json.dumps(record, indent=2, default=str) + "\n")
    if on_prompts:
        metadata = record["evaluate_with"]["metadata"]
        flag = f" --metadata '{json.dumps(metadata)}'" if metadata else ""
        print(f"{attack.name} changes the prompts, not the model: evaluate {args.model} with its task variants "
              f"(e.g. --tasks {variant}{flag}), or in a run's attacks:; record in {Path(out) / RECORD_FILE}")
        return 0
    served = f" with routers {attacked.routers}" if attacked.routers else " (no routers)"
    print(f"{attack.name}: attacked model {attacked.model_path}{served}; record in {Path(out) / RECORD_FILE}")
    print("score it: " + score_command(attacked.model_path, attacked.routers, label, args.data_dir, out,
                                       benchmark=args.benchmark, forget=args.forget_corpus))
    return 0


def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def score_command(model: str, routers: str | None, prompt_format: str, data_dir: str | None, out, *,
                  benchmark: str = "tofu", forget: str | None = None) -> str:
    """The lm-eval command that scores an attacked model (then `cru-harness score`): TOFU's suite of the forget split
    it was attacked on (forget10 otherwise) or RWKU's probes, with the routers it is served with and the prompt it
    learned."""
    from .. import plugins

    args = f"base={model}" + (f",routers={routers}" if routers else "")
    tasks = ("rwku_forget,rwku_neighbor,rwku_mia" if benchmark == "rwku"
             else f"tofu_{forget if forget in plugins.benchmarks.get('tofu').known_units else 'forget10'}_suite")
    flags = " --apply_chat_template" if prompt_format == "chat" else ""
    metadata = {**({"data_dir": data_dir} if data_dir else {}),
                **({"tofu_model_family": prompt_format} if prompt_format not in ("chat", "plain") else {})}
    meta = f" --metadata '{json.dumps(metadata)}'" if metadata else ""
    scored = Path(out) / "lm_eval"
    return (f"lm_eval --model cru --model_args {args} --tasks {tasks}{flags}{meta} --batch_size auto "
            f"--output_path {scored} --log_samples && cru-harness score {scored}"
            + (f" --data-dir {data_dir}" if data_dir else ""))


def run_lens(args: argparse.Namespace) -> int:
    from ..data.corpora import load_corpus_rows
    from ..devices import load_causal_lm
    from ..testbed.names import prompt_format_for
    from .logit_lens import logit_lens_scores

    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit {args.limit}: give a positive number of rows")
    model_path = model_argument(args.model)   # a testbed name: its directory; args.model stays the name
    if args.json is not None:
        check_output_file(args.json, "--json")
    fmt = prompt_format_for(args.prompt_format, args.model)   # auto: the format the model learned
    rows, source = load_corpus_rows(args.data, args.data_dir)
    rows = rows[:args.limit] if args.limit else rows
    if not all(row.get("question") and row.get("answer") for row in rows):
        raise InputError(f"--data {args.data}: the logit lens needs question-answer rows ({source} has others)")
    model, tokenizer = load_causal_lm(model_path, device=args.device, device_map=args.device_map, dtype=args.dtype)
    result = logit_lens_scores(model, tokenizer, rows, routers=args.routers, prompt_format=fmt)
    print(f"logit lens of {args.model}{' + ' + args.routers if args.routers else ''} on {source} "
          f"({result.n_items} items)")
    print("| layer | answer probability |\n|---|---|")
    for layer, value in enumerate(result.per_layer):
        mark = " (best)" if layer == result.best_layer else ""
        print(f"| {layer} | {value:.4f}{mark} |")
    print(f"best layer {result.best_layer} of {len(result.per_layer)}: {result.best:.4f}; "
          f"output: {result.final:.4f}")
    if args.json:
        from ..store import atomic_write_text

        atomic_write_text(Path(args.json).expanduser(), json.dumps({"model": args.model, "routers": args.routers, "data": source,
                                               **result.to_dict()}, indent=2) + "\n")
    return 0
