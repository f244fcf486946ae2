"""`cru-harness unlearn` (train a router bundle) and `cru-harness inspect` (show one without loading the base)."""
from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from cru_harness.arguments import config_defaults_help, field_defaults, given_fields
from cru_harness.devices import add_device_arguments
from cru_harness.prompts import add_prompt_format_argument, prompt_format_label
from cru_harness.hparams import HPARAM_CHOICES

from ..errors import InputError, excerpt
from ..training.lora import add_training_arguments, lora_from_args


@functools.cache
def unlearn_defaults() -> dict[str, str]:
    """`unlearn`'s option defaults: `RouterTrainingConfig`'s (the paper's TOFU setting) and, where a benchmark's
    setting of CRU differs, that benchmark's (`Benchmark.method_settings`; the modules are the source, the flags copy
    nothing); `--benchmark`'s: the first registered benchmark, and the others."""
    from cru_harness import plugins

    from .plugin import METHOD
    from .train import RouterTrainingConfig

    text = field_defaults(RouterTrainingConfig)
    where: dict[tuple[str, str], list[str]] = {}   # (option, value) -> the benchmarks setting it
    for benchmark in plugins.benchmarks:
        for name, value in benchmark.method_settings(METHOD.name, None).items():
            where.setdefault((name, str(value)), []).append(benchmark.name)
    for (name, value), names in where.items():
        text[name] = f"{text[name]}; {value} with --benchmark {' or '.join(names)}"
    names = plugins.benchmarks.names()
    text["benchmark"] = f"{names[0]}; registered: {', '.join(names)}"
    return text


def register(subparsers) -> None:
    unlearn = subparsers.add_parser(
        "unlearn", help="unlearn a forget set: train CRU routers into a bundle (default), or any method (--method)",
        description="Localize the forget set's neurons in a frozen base model, train routers that close them on "
                    "forget inputs and keep them open on retain inputs, and save the bundle to --out.",
        formatter_class=config_defaults_help(unlearn_defaults))
    unlearn.add_argument("--method", default="CRU",
                         help="the unlearning method (`cru-harness methods` lists them; default CRU). The CRU options "
                              "below apply to CRU; any other method's hyperparameters are given with --set")
    unlearn.add_argument("--set", dest="hparams", action="append", default=[], metavar="KEY=VALUE",
                         help="a hyperparameter of --method (e.g. --set learning_rate=1e-5 --set beta=0.1); "
                              "values are read as YAML scalars; repeat for several")
    unlearn.add_argument("--base", required=True,
                         help="HF model id, local checkpoint directory, or testbed model (zoo:llama:finetuned, "
                              "smollm2)")
    unlearn.add_argument("--forget", required=True,
                         help="forget corpus: JSON/JSONL file (question+answer or text rows) or a benchmark's corpus "
                              "name (TOFU's forget10, RWKU's targets' passages; an unknown name's error lists each "
                              "benchmark's forms)")
    unlearn.add_argument("--retain", required=True, help="retain corpus (same forms as --forget)")
    unlearn.add_argument("--out", required=True, help="directory to write the router bundle to (checked before "
                                                      "training; must not hold earlier work unless --overwrite)")
    unlearn.add_argument("--overwrite", action="store_true",
                         help="replace an existing bundle (or other files) in --out")
    unlearn.add_argument("--data-dir", default=None,
                         help="local TOFU/RWKU data root, or testbed:world (default: env or the Hub)")
    add_prompt_format_argument(unlearn)
    unlearn.add_argument("--benchmark", default=None,
                         help="the registered benchmark whose evaluation the question/answer rows are written for, "
                              "and whose settings of the method apply (TOFU: its prompt, --prompt-format; RWKU: each "
                              "probe file's row as that probe asks it, other rows as its QA probe, no model config "
                              "name)")
    # The training options default to RouterTrainingConfig's fields (SUPPRESS: an option not given is not passed).
    config = argparse.SUPPRESS
    unlearn.add_argument("--blocks", default=config,
                         help="comma-separated block indices to gate (negative = from the end); overrides --last-k")
    unlearn.add_argument("--last-k", type=int, default=config, help="gate the last K decoder blocks")
    unlearn.add_argument("--percentile", type=float, default=config, help="variance percentile p")
    unlearn.add_argument("--selection", choices=HPARAM_CHOICES["selection"], default=config,
                         help="variance (CRU) or random (a control: the same blocks and counts)")
    unlearn.add_argument("--d-r", type=int, default=config, help="router bottleneck width")
    unlearn.add_argument("--lambda", dest="lam", type=float, default=config, help="retain weight λ")
    unlearn.add_argument("--epochs", type=int, default=config, help="epochs over the forget set")
    unlearn.add_argument("--lr", type=float, default=config, help="the routers' learning rate")
    unlearn.add_argument("--batch-size", type=int, default=config, help="forget rows per step")
    unlearn.add_argument("--max-length", type=int, default=config, help="tokens per example")
    unlearn.add_argument("--seed", type=int, default=config,
                         help="seed of the routers' init, the batch order and a random selection")
    unlearn.add_argument("--input-norm", choices=HPARAM_CHOICES["input_norm"], default=config,
                         help="router input normalisation: none (the paper), rms (h / rms(h)), "
                              "rms_learned (rms with a learned per-dimension scale)")
    options = unlearn.add_argument_group("options beyond the paper")
    options.add_argument("--suppress-loss", choices=HPARAM_CHOICES["suppress_loss"], default=config,
                         help="forget term of the loss: linear w (paper) or quadratic w^2")
    options.add_argument("--pass-loss", choices=HPARAM_CHOICES["pass_loss"], default=config,
                         help="retain term of the loss: quadratic (w-1)^2 (paper) or linear 1-w")
    options.add_argument("--exclude-top-magnitude", type=float, default=config, metavar="Q",
                         help="keep each block's top Q%% of coordinates by mean |activation| on the forget set out "
                              "of selection (the paper: 0)")
    options.add_argument("--gate-site", choices=HPARAM_CHOICES["gate_site"], default=config,
                         help="gate the blocks' residual stream (paper) or their MLP neurons (the input of the "
                              "MLP's down projection)")
    options.add_argument("--retain-batch-ratio", type=int, default=config, metavar="R",
                         help="batch composition: R retain rows per forget row in each step (the paper: 1)")
    options.add_argument("--router-init", choices=HPARAM_CHOICES["router_init"], default=config,
                         help="how new routers start: default (PyTorch's init; the paper does not say) or open "
                              "(every gate at 0.99, the base nearly untouched)")
    readings = unlearn.add_argument_group("readings the paper leaves open (docs/cru_method.md)")
    readings.add_argument("--token-scope", choices=HPARAM_CHOICES["token_scope"], default=config,
                          help="positions the loss reads and the gates act on: all real tokens, or answer (from the "
                               "prompt's end marker on, in training and at inference)")
    readings.add_argument("--localization-tokens", choices=HPARAM_CHOICES["localization_tokens"], default=config,
                          help="positions the variance pools: all real tokens, or content (no template or special "
                               "token)")
    readings.add_argument("--block-output", choices=HPARAM_CHOICES["block_output"], default=config,
                          help="the output of block l: the block's own (block), or HF's hidden_states entry l "
                               "(hf_hidden_states: the last one after the final norm)")
    unlearn.add_argument("--no-prefix-cache", action="store_true",
                         help="recompute the frozen blocks below the gated ones at every step instead of once per "
                              "example (same routers, less memory, slower)")
    add_device_arguments(unlearn, dtype_help="dtype to run the frozen base in (routers are always float32; "
                                              "default float32)")
    add_training_arguments(unlearn)
    unlearn.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    unlearn.set_defaults(func=run_unlearn)

    inspect = subparsers.add_parser("inspect", help="print a router bundle's manifest and sizes",
                                    description="Validate a router bundle (manifest version and fields, weights "
                                                "file, SHA-256, tensor shapes, block and neuron indices) and print "
                                                "its manifest, file sizes and parameter counts; the base model is "
                                                "not loaded (--base reads only its config).")
    inspect.add_argument("bundle", help="router bundle directory")
    inspect.add_argument("--json", action="store_true", help="print the raw manifest JSON")
    inspect.add_argument("--base", default=None,
                         help="also check the bundle against this base model (HF id, local directory or testbed "
                              "model; only its config is read)")
    inspect.set_defaults(func=run_inspect)


def _parse_blocks(spec: str) -> list[int]:
    try:
        return [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--blocks must be comma-separated integers, got {spec!r}") from None


def _corpus_rows(source: str, data_dir, what: str) -> tuple[list[dict], str]:
    """A corpus's rows, every row checked, before any model is loaded (a bad row costs no model load)."""
    from cru_harness.arguments import CLIError
    from cru_harness.data.corpora import load_corpus_rows
    from cru_harness.data.sources import DataSourceError

    try:
        return load_corpus_rows(source, data_dir)
    except DataSourceError as err:
        raise CLIError(f"{what} corpus: {err}") from None


def _set_values(pairs: list[str]) -> dict:
    """`--set KEY=VALUE` pairs as a dict, each value read as a YAML scalar (1e-5, true, [0.9, 0.99]) by the
    project's one YAML loader; a key given twice is refused (the last would win silently)."""
    from cru_harness.yamlfile import load_value

    values = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set expects KEY=VALUE, got {excerpt(pair, 80)}")
        if key.strip() in values:
            raise InputError(f"--set {excerpt(key.strip(), 80)} is given twice: give it once")
        value = load_value(text, f"--set {excerpt(key.strip(), 80)}")
        if isinstance(value, str):   # YAML 1.1 reads 1e-5 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        values[key.strip()] = value
    return values


def _method_hparams(method, given: dict) -> dict:
    """`--set` values under their canonical names, each one a hyperparameter of `method`."""
    import difflib

    allowed = method.hparams()
    resolved = {}
    for key, value in given.items():
        canon = method.aliases.get(key, key)
        if canon not in allowed:
            reason = method.refuse_hparam(canon)
            close = difflib.get_close_matches(canon, allowed, n=1)
            raise InputError(f"--set {key}: " + (reason or f"not a hyperparameter of {method.name}"
                                                   + (f" (did you mean {close[0]!r}?)" if close else "")
                                                   + f"; it accepts: {', '.join(allowed) or 'nothing'}"))
        resolved[canon] = value
    return resolved


def run_baseline(args: argparse.Namespace, method) -> int:
    """`unlearn --method` for a trainer of `cru_harness.baselines`: --benchmark's defaults for it (on the unit
    --forget names), `--set` overrides, the same checks before loading, the model saved to --out."""
    from cru_harness import plugins
    from cru_harness.hparams import check_seed
    from cru_harness.locations import check_model_path, check_output_dir, command_output_lock
    from cru_harness.testbed.names import prompt_format_for, resolve_model_path

    from .train import RouterTrainingConfig

    # A trainer plugin (`baselines.plugin.BaselineMethod`, found through the registry: cru and baselines are
    # independent packages) offers its trainer class and `train`.
    if not (callable(getattr(method, "train", None)) and hasattr(getattr(method, "trainer", None), "Config")):
        what = "trains nothing" if not method.trains else "is not a trainer of cru_harness.baselines"
        raise InputError(f"--method {method.name} {what}: run it from a runner config (`cru-harness run`)")
    cru_only = sorted(set(given_fields(args, RouterTrainingConfig)) - {"seed"})
    if cru_only or args.no_prefix_cache:
        flags = ", ".join("--" + name.replace("_", "-") for name in cru_only) or "--no-prefix-cache"
        raise InputError(f"{flags}: CRU's options; give {method.name}'s hyperparameters with --set KEY=VALUE")
    seed = check_seed(getattr(args, "seed", 0))
    benchmark = plugins.benchmarks.get(args.benchmark)
    # as a runner cell's: the benchmark's setting of the method, the method's own for it, then --set
    given = {**benchmark.method_settings(method.name, None), **method.benchmark_defaults.get(benchmark.name, {}),
             **_method_hparams(method, _set_values(args.hparams))}
    # --forget as the unit: a benchmark whose settings depend on it reads a corpus naming one of its units (TOFU's
    # forget05) and ignores other corpora
    defaults = benchmark.method_defaults(method.name, args.forget, tuple(given))
    config = method.trainer.Config.with_defaults(defaults, **given)
    fmt = prompt_format_for(args.prompt_format, args.base, args.benchmark)   # auto: the format the base learned
    check_output_dir(args.out, what="--out", overwrite=args.overwrite)
    base_path = check_model_path(resolve_model_path(args.base), what="--base")
    forget_rows = _corpus_rows(args.forget, args.data_dir, "forget")[0]
    retain_rows = _corpus_rows(args.retain, args.data_dir, "retain")[0]
    with command_output_lock(args.out):
        check_output_dir(args.out, what="--out", overwrite=args.overwrite)   # again, now that it is ours
        result = method.train(base_path, forget_rows, retain_rows, config, args.out, seed=seed,
                              data_dir=args.data_dir, dtype=args.dtype, device=args.device,
                              device_map=args.device_map, progress=not args.no_progress, prompt_format=fmt,
                              overwrite=args.overwrite, lora=lora_from_args(args),
                              gradient_checkpointing=args.gradient_checkpointing)
    from accelerate.state import PartialState

    if PartialState().is_main_process:   # under accelerate launch, once
        what = "LoRA adapter" if result.lora else "model"
        print(f"saved the {method.name}-unlearned {what} to {args.out}: {result.optimizer_steps} optimizer steps on "
              f"{result.n_forget} forget and {result.n_retain} retain rows")
    return 0


def run_unlearn(args: argparse.Namespace) -> int:
    from cru_harness import plugins
    from cru_harness.locations import command_output_lock

    method = plugins.methods.get(args.method)
    # a registered benchmark (an unknown name: one line listing them); none given: the first registered (TOFU)
    args.benchmark = plugins.benchmarks.get(args.benchmark).name if args.benchmark else plugins.benchmarks.names()[0]
    if not method.adapter:
        return run_baseline(args, method)
    if method is not plugins.methods.get("CRU"):
        raise InputError(f"--method {method.name}: `unlearn` trains CRU bundles; run it from a runner config")
    if lora_from_args(args) is not None or args.gradient_checkpointing:
        raise InputError("--lora*, --gradient-checkpointing: options of the methods that train weights; CRU trains "
                         "routers on a frozen base")
    from cru_harness.devices import launched_processes

    if (n := launched_processes()) > 1:
        raise InputError(f"--method CRU runs in one process, and {n} were launched (accelerate launch / torchrun): "
                         "its routers train beside a frozen base; start it without them")
    with command_output_lock(args.out):
        return run_cru(args)


def run_cru(args: argparse.Namespace) -> int:
    from cru_harness import plugins
    from cru_harness.data.corpora import rows_to_texts
    from cru_harness.devices import load_causal_lm
    from cru_harness.locations import check_model_path, check_output_dir
    from cru_harness.hparams import check_seed
    from cru_harness.testbed.names import prompt_format_for, resolve_model_path

    from .plugin import METHOD
    from .train import RouterTrainingConfig, train_routers

    # Everything that can be wrong with the inputs and the output is found before hours of training.
    given = {**given_fields(args, RouterTrainingConfig), **_method_hparams(METHOD, _set_values(args.hparams))}
    check_seed(given.get("seed", 0))   # named as the flag
    if "blocks" in given:
        given["blocks"] = _parse_blocks(given["blocks"])
    config = RouterTrainingConfig(
        # the paper's setting for --benchmark (`Benchmark.method_settings`, as in a runner config's cells)
        **{**plugins.benchmarks.get(args.benchmark).method_settings(METHOD.name, None), **given},
        forget_description=str(args.forget), retain_description=str(args.retain), progress=not args.no_progress,
        prefix_cache=not args.no_prefix_cache)
    fmt = prompt_format_for(args.prompt_format, args.base, args.benchmark)   # auto: the format the base learned
    check_output_dir(args.out, what="--out", overwrite=args.overwrite)
    base_path = check_model_path(resolve_model_path(args.base), what="--base")
    forget_rows = _corpus_rows(args.forget, args.data_dir, "forget")
    retain_rows = _corpus_rows(args.retain, args.data_dir, "retain")

    try:
        model, tokenizer = load_causal_lm(base_path, device=args.device, device_map=args.device_map,
                                          dtype=args.dtype)
    except OSError as err:
        from cru_harness.arguments import CLIError
        raise CLIError(f"cannot load base model {args.base!r}: {err}") from None
    if fmt["chat"] and not tokenizer.chat_template:
        from cru_harness.arguments import CLIError
        raise CLIError(f"--prompt-format chat: the tokenizer of {args.base!r} has no chat template")
    forget = rows_to_texts(*forget_rows, tokenizer=tokenizer, **fmt)
    retain = rows_to_texts(*retain_rows, tokenizer=tokenizer, **fmt)
    model.eval()
    template = None
    if (config.token_scope, config.localization_tokens) != ("all", "all"):   # the answer's marker, the template
        from .readings import prompt_template

        template = prompt_template(tokenizer, **fmt)
    extra = {} if template is None else {"template": template}   # the default call, as before the readings
    bundle = train_routers(model, tokenizer, forget, retain, config, **extra)
    bundle.config.base_model = str(args.base)
    bundle.config.training["prompt_format"] = prompt_format_label(fmt, tokenizer)   # checked by the cru model
    from cru_harness.locations import write_directory

    out = write_directory(args.out, bundle.save_pretrained, overwrite=args.overwrite, what="--out")
    metrics = bundle.config.metrics
    print(f"saved router bundle to {out}: blocks {bundle.block_indices}, "
          f"{bundle.config.router_parameters:,} router parameters; "
          f"gate mean forget {metrics['forget_gate_mean']:.3f}, retain {metrics['retain_gate_mean']:.3f}")
    return 0


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def config_only_model(base: str):
    """An object with the base's `.config` and nothing else: what `RouterBundle.check_compatible` reads
    (architecture, hidden size, layer count, vocabulary), without loading weights."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    from cru_harness.arguments import CLIError
    from cru_harness.locations import check_model_path

    from cru_harness.testbed.names import resolve_model_path

    base = check_model_path(resolve_model_path(base), what="--base")
    try:
        config = AutoConfig.from_pretrained(base)
    except (OSError, ValueError) as err:
        raise CLIError(f"cannot read the config of base model {base!r}: {err}") from None
    return SimpleNamespace(config=config)


def run_inspect(args: argparse.Namespace) -> int:
    from .bundle import MANIFEST_NAME, RouterBundle, read_manifest, weights_path

    directory = Path(args.bundle)
    # The same validation as loading for evaluation: a bundle that inspects cleanly loads cleanly.
    bundle = RouterBundle.from_pretrained(directory)
    if args.base:
        bundle.check_compatible(config_only_model(args.base))
    manifest = read_manifest(directory)
    if args.json:
        print(json.dumps(manifest, indent=2, sort_keys=True))
        return 0
    fingerprint = manifest.get("fingerprint", {})
    metrics = manifest.get("metrics", {})
    router_params = int(manifest.get("router_parameters", 0))
    base_params = int(manifest.get("base_parameters", 0))
    weights = weights_path(directory, manifest)
    neurons = manifest.get("neurons", {})
    lines = [
        f"router bundle: {directory}",
        f"  format version : {manifest.get('format_version')}",
        f"  base model     : {manifest.get('base_model')}",
        f"  fingerprint    : {fingerprint.get('architecture')}, hidden {fingerprint.get('hidden_size')}, "
        f"{fingerprint.get('num_layers')} layers, vocab {fingerprint.get('vocab_size')} "
        f"(hash {fingerprint.get('hash')})",
        f"  blocks         : {manifest.get('block_indices')}",
        "  neurons/block  : " + ", ".join(f"{b}: {len(idx)}" for b, idx in sorted(neurons.items(),
                                                                                key=lambda kv: int(kv[0]))),
        f"  selection      : {manifest.get('selection')} (percentile {manifest.get('percentile')})",
        f"  d_r            : {manifest.get('d_r')}   lambda: {manifest.get('lam')}   seed: {manifest.get('seed')}"
        f"   input_norm: {manifest.get('input_norm')}",
        # Manifests written before these options existed are paper-setting bundles: show the defaults.
        f"  loss shape     : suppress {manifest.get('suppress_loss', 'linear')}, "
        f"pass {manifest.get('pass_loss', 'quadratic')}",
        f"  gate site      : {manifest.get('gate_site', 'residual')}"
        + (f" ({manifest['site_width']} coordinates per block)" if manifest.get("site_width") else ""),
        f"  excluded       : top {manifest.get('exclude_top_magnitude', 0.0)}% by mean |activation|"
        + (" (" + ", ".join(f"{b}: {len(idx)}" for b, idx in sorted(manifest["excluded"].items(),
                                                                    key=lambda kv: int(kv[0]))) + ")"
           if manifest.get("excluded") else ""),
        f"  router params  : {router_params:,}"
        + (f" ({100.0 * router_params / base_params:.4f}% of the base's {base_params:,})" if base_params else ""),
    ]
    if metrics:
        lines.append(f"  gate means     : forget {metrics.get('forget_gate_mean', float('nan')):.4f}, "
                     f"retain {metrics.get('retain_gate_mean', float('nan')):.4f} "
                     f"(after {metrics.get('steps')} steps)")
    training = manifest.get("training", {})
    if training:   # a bundle trained before retain_batch_ratio existed drew one retain row per forget row
        lines.append(f"  training       : {training.get('epochs')} epochs, lr {training.get('lr')}, batch "
                     f"{training.get('batch_size')} forget + "
                     f"{training.get('batch_size', 0) * training.get('retain_batch_ratio', 1)} retain rows per step, "
                     f"routers started {training.get('router_init', 'default')}")   # older bundles: the default
    set_readings = [f"{name} {manifest[name]}" for name in ("token_scope", "localization_tokens", "block_output")
                    if name in manifest]   # written only when not the default (cru.readings)
    if set_readings:
        lines.append("  readings       : " + ", ".join(set_readings)
                     + (f" (answer marker: {len(manifest.get('answer_marker', []))} tokens)"
                        if manifest.get("token_scope") == "answer" else ""))
    data = manifest.get("training_data", {})
    for side in ("forget", "retain"):
        if side in data:
            lines.append(f"  {side:<6} data    : {data[side].get('description') or '?'} "
                         f"({data[side].get('n_examples')} examples)")
    lines.append(f"  files          : {MANIFEST_NAME} {_human_bytes((directory / MANIFEST_NAME).stat().st_size)}, "
                 f"{weights.name} "
                 + _human_bytes(weights.stat().st_size))
    lines.append("  libraries      : " + ", ".join(f"{k} {v}" for k, v in
                                                     sorted(manifest.get("library_versions", {}).items())))
    if args.base:
        lines.append(f"  base check     : compatible with {args.base}")
    print("\n".join(lines))
    return 0
