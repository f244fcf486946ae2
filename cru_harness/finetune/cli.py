"""`cru-harness finetune`: TOFU's fine-tuning recipe from the command line (see `finetune.train`)."""
from __future__ import annotations

import argparse
import functools

from ..arguments import config_defaults_help, field_defaults, given_fields
from ..devices import add_device_arguments
from ..prompts import add_prompt_format_argument
from ..hparams import HPARAM_CHOICES
from ..training.lora import add_training_arguments, lora_from_args


@functools.cache
def finetune_defaults() -> dict[str, str]:
    """The recipe's option defaults: `FinetuneConfig`'s, TOFU's."""
    from .train import FinetuneConfig

    return field_defaults(FinetuneConfig)



def register(subparsers) -> None:
    p = subparsers.add_parser(
        "finetune", help="fine-tune a causal LM on QA rows with TOFU's recipe (the model TOFU unlearning starts from)",
        description="TOFU's fine-tuning recipe: loss on answer tokens + EOS, the evaluation's prompt, AdamW with "
                    "linear warm-up and decay; every default below is TOFU's. "
                    "Multi-GPU: accelerate launch -m cru_harness finetune ...",
        formatter_class=config_defaults_help(finetune_defaults))
    p.add_argument("--model", required=True,
                   help="HF model id, local checkpoint directory, or testbed model (zoo:llama:finetuned, smollm2)")
    p.add_argument("--data", required=True,
                   help="a benchmark's corpus name (TOFU's full, retain90, ...; an RWKU target's passages; an "
                        "unknown name's error lists each benchmark's forms) or a JSON/JSONL file (question+answer or "
                        "text rows)")
    p.add_argument("--out", required=True, help="directory to save the fine-tuned model to")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.add_argument("--data-dir", default=None,
                   help="local TOFU/RWKU data root, or testbed:world (default: env or the Hub)")
    # The recipe's options default to FinetuneConfig's fields (SUPPRESS: an option not given is not passed).
    config = argparse.SUPPRESS
    p.add_argument("--lr", dest="learning_rate", metavar="LR", type=float, default=config, help="learning rate")
    p.add_argument("--weight-decay", type=float, default=config, help="AdamW weight decay")
    p.add_argument("--epochs", dest="num_epochs", metavar="EPOCHS", type=int, default=config, help="epochs")
    p.add_argument("--batch-size", dest="effective_batch_size", metavar="BATCH_SIZE", type=int, default=config,
                   help="effective batch size")
    p.add_argument("--micro-batch-size", type=int, default=config,
                   help="per-process batch; the rest is gradient accumulation")
    p.add_argument("--warmup-epochs", type=float, default=config, help="linear warm-up epochs")
    p.add_argument("--scheduler", dest="lr_scheduler", choices=HPARAM_CHOICES["lr_scheduler"], default=config,
                   help="decay after the warm-up")
    p.add_argument("--max-length", type=int, default=config, help="tokens per example")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    add_prompt_format_argument(p)
    add_device_arguments(p, dtype_help="float32; bfloat16 / float16 = fp32 master weights under bf16 / fp16 "
                                       "autocast, saved in that dtype (default float32)")
    add_training_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run_finetune)


def run_finetune(args: argparse.Namespace) -> int:
    from ..hparams import check_seed

    check_seed(args.seed)
    from accelerate.state import PartialState

    from .train import FinetuneConfig, finetune

    from ..testbed.names import prompt_format_for, resolve_model_path

    fmt = prompt_format_for(args.prompt_format, args.model)   # auto: the format the model learned, if recorded
    config = FinetuneConfig(**given_fields(args, FinetuneConfig))
    from ..locations import command_output_lock

    with command_output_lock(args.out):   # a second finetune to the same --out is refused, not raced
        result = finetune(resolve_model_path(args.model), args.data, args.out, config=config, seed=args.seed,
                          data_dir=args.data_dir, dtype=args.dtype, device=args.device, device_map=args.device_map,
                          chat_template=fmt["chat"], family=fmt["family"], overwrite=args.overwrite,
                          progress=not args.no_progress, lora=lora_from_args(args),
                          gradient_checkpointing=args.gradient_checkpointing)

    if PartialState().is_main_process:
        print(f"saved fine-tuned model to {args.out}: {result.n_rows} rows, {result.optimizer_steps} steps "
              f"({result.num_processes} process(es) x up to {result.gradient_accumulation_steps} micro-batches a "
              f"step), final loss {result.final_logs.get('loss', float('nan')):.4f}")
    return 0
