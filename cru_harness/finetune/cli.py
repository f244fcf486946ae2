"""`cru-harness finetune`: TOFU's fine-tuning recipe from the command line (see `finetune.train`)."""
from __future__ import annotations

import argparse

from ..devices import add_device_arguments
from ..prompts import add_prompt_format_argument, prompt_format_choice


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "finetune", help="fine-tune a causal LM on QA rows with TOFU's recipe (the model TOFU unlearning starts from)",
        description="TOFU's fine-tuning recipe: loss on answer tokens + EOS, the evaluation's prompt, AdamW "
                    "lr 1e-5, weight decay 0.01, 5 epochs, effective batch 32, 1 warm-up epoch, linear decay. "
                    "Multi-GPU: accelerate launch -m cru_harness finetune ...")
    p.add_argument("--model", required=True, help="HF model id or local checkpoint directory")
    p.add_argument("--data", required=True,
                   help="TOFU config (full, retain90, ...), JSON/JSONL file (question+answer or text rows), or "
                        "rwku:<target>:<kind>")
    p.add_argument("--out", required=True, help="directory to save the fine-tuned model to")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.add_argument("--data-dir", default=None, help="local TOFU/RWKU data root (default: env or the Hub)")
    p.add_argument("--lr", type=float, default=1e-5, help="learning rate (default 1e-5)")
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (default 0.01)")
    p.add_argument("--epochs", type=int, default=5, help="epochs (default 5)")
    p.add_argument("--batch-size", type=int, default=32, help="effective batch size (default 32)")
    p.add_argument("--micro-batch-size", type=int, default=4,
                   help="per-process batch; the rest is gradient accumulation (default 4)")
    p.add_argument("--warmup-epochs", type=float, default=1.0, help="linear warm-up epochs (default 1)")
    p.add_argument("--scheduler", choices=("linear", "cosine", "constant"), default="linear")
    p.add_argument("--max-length", type=int, default=512, help="tokens per example (default 512)")
    p.add_argument("--seed", type=int, default=0)
    add_prompt_format_argument(p)
    add_device_arguments(p, dtype_help="float32; bfloat16 / float16 = fp32 master weights under bf16 / fp16 "
                                       "autocast, saved in that dtype (default float32)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run_finetune)


def run_finetune(args: argparse.Namespace) -> int:
    from ..runner.config import check_seed

    check_seed(args.seed)
    fmt = prompt_format_choice(args.prompt_format)
    from accelerate.state import PartialState

    from .train import FinetuneConfig, finetune

    config = FinetuneConfig(learning_rate=args.lr, weight_decay=args.weight_decay, num_epochs=args.epochs,
                            effective_batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
                            warmup_epochs=args.warmup_epochs, lr_scheduler=args.scheduler,
                            max_length=args.max_length)
    result = finetune(args.model, args.data, args.out, config=config, seed=args.seed, data_dir=args.data_dir,
                      dtype=args.dtype, device=args.device, device_map=args.device_map, chat_template=fmt["chat"],
                      family=fmt["family"], overwrite=args.overwrite, progress=not args.no_progress)

    if PartialState().is_main_process:
        print(f"saved fine-tuned model to {args.out}: {result.n_rows} rows, {result.optimizer_steps} steps "
              f"({result.num_processes} process(es) x {result.gradient_accumulation_steps} accumulation), "
              f"final loss {result.final_logs.get('loss', float('nan')):.4f}")
    return 0
