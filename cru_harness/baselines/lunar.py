"""LUNAR (Shen et al. 2025, "LUNAR: LLM Unlearning via Neural Activation Redirection"), as its code runs it.

r = mean over refusal prompts of h_L(last prompt token) - mean over the forget prompts of the same, h_L the output
of decoder block `layer` of the starting model. Then a copy of block `layer`'s MLP down projection (its only
trained weight) is fitted on activations cached from the starting model, every token of every prompt one example:
forget tokens map their down-projection input to the MLP output plus coeff * r, retain tokens to the MLP output
unchanged; the two pooled and shuffled every epoch into batches of `token_batch_size` tokens, the loss an MSE over
the batch's tokens and coordinates (torch MSELoss). The fitted weight replaces the block's down projection.

Followed from LUNAR's code (facebookresearch/LUNAR run_lunar.py, src/generate_directions.py,
src/dataset_utils.py `prepare_trainset`, src/hook_for_unlearn.py `get_activations` /
`perturb_post_block_activations_forget`, src/estimated_net_utils.py `train`): the direction (mean difference at
the last prompt position, refusal minus forget, `positions: -1`, read at the input of block L+1 = the output of
block L); every token of a question as LUNAR writes its prompt (the chat template's user turn, no system turn:
`lunar_prompt`; `prompt_style: evaluation` for the evaluation's, system turn included), one prompt at a time, the
answer not used (`instructions_only`); the target of a forget token (block output + coeff * r, less the residual entering the
MLP: the MLP output + coeff * r) and of a retain token (the MLP output); the retain prompts all the retain rows'
questions (LUNAR: every question of the dataset outside the forget edge); one ConcatDataset of forget and retain
tokens, DataLoader(batch_size=64, shuffle=True); torch AdamW at lr 0.01 (its default weight decay 0.01),
ExponentialLR(0.9) stepped every epoch, 20 epochs, no clipping; config/forget.yaml's layer 22 (of a 32-block
model such as Llama-3-8B-Instruct) and coeff +2.0. The prompts the model refuses are LUNAR's
dataset/splits/harmful.json (260 harmful instructions): pass the file as `refusal_prompts_path`.

Beyond LUNAR's code: `forget_weight` and `alpha` weight a forget and a retain token's squared error (1 and 1:
LUNAR's plain MSE; alpha 0: no retain tokens); a retain row without a question (a passage) gives all its tokens.
The fit runs in float32 on the down projection's device (LUNAR fits in the model's dtype). One layer: LUNAR's
list of layers fits each on the starting model's activations (`layer` is one).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..training.blocks import find_decoder_blocks
from ..training.sites import mlp_down_projection
from ..data.corpora import row_prompt
from ..errors import InputError, MissingInputError
from ..hparams import bound_problem
from ._activations import block_output, decoder_block
from .base import RetainConfig, UnlearningMethod
from ..prompts import qa_texts
from .data import row_to_qa
from .plugin import BaselineMethod
from .registry import register_method


#: `LUNARConfig.prompt_style`'s choices.
PROMPT_STYLES = ("lunar", "evaluation")


@dataclass
class LUNARConfig(RetainConfig):
    layer: int = 22                       # LUNAR config/forget.yaml layer_modified [22]
    coeff: float = 2.0                    # coeff_list [+2.0]
    lr_decay: float = 0.9                 # ExponentialLR gamma, per epoch
    refusal_prompts_path: str | None = None   # prompts the model refuses (LUNAR: dataset/splits/harmful.json)
    token_batch_size: int = 64            # run_lunar.py DataLoader(batch_size=64): tokens, not rows
    learning_rate: float = 0.01
    num_epochs: int = 20
    weight_decay: float = 0.01            # torch AdamW's default, which LUNAR keeps
    warmup_epochs: float = 0.0
    lr_scheduler: str = "constant"        # unused: the fit decays the rate by lr_decay every epoch
    max_grad_norm: float | None = None
    # "lunar": the prompt as LUNAR's code writes it, the chat template's user turn alone (`lunar_prompt`);
    # "evaluation": as the evaluation asks it, system turn included (the setting before issue 77)
    prompt_style: str = "lunar"

    def __post_init__(self):
        super().__post_init__()
        for name, rule in (("layer", dict(low=0, integer=True)), ("coeff", dict()),
                           ("lr_decay", dict(above=0, high=1)), ("token_batch_size", dict(low=1, integer=True))):
            if problem := bound_problem(getattr(self, name), **rule):
                raise InputError(f"{name}: {problem}")
        if self.prompt_style not in PROMPT_STYLES:
            raise InputError(f"prompt_style {self.prompt_style!r}: choose one of {', '.join(PROMPT_STYLES)}")


def read_prompts(path: str) -> list[str]:
    """Prompts from a JSON list (strings, or objects with `instruction` / `question` / `prompt`) or JSON lines."""
    from ..errors import excerpt

    file = Path(path)
    if file.is_dir():
        raise InputError(f"refusal_prompts_path {excerpt(str(path), 120)} is a directory: give the JSON file of "
                         "prompts (LUNAR's dataset/splits/harmful.json)")
    if not file.is_file():
        raise MissingInputError(f"refusal_prompts_path {excerpt(str(path), 120)} does not exist")
    try:
        text = file.read_text(encoding="utf-8")
        try:
            rows = json.loads(text)
        except json.JSONDecodeError:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{excerpt(str(path), 120)}: not a JSON list of prompts nor JSON lines ({err})") from None
    if not isinstance(rows, list):
        raise InputError(f"{excerpt(str(path), 120)}: expected a JSON list of prompts (strings), got a "
                         f"{type(rows).__name__}")
    prompts = []
    for row in rows:
        value = row if isinstance(row, str) else next(
            (row[k] for k in ("instruction", "question", "prompt") if isinstance(row, dict) and k in row), None)
        if not isinstance(value, str) or not value:
            raise InputError(f"{path}: each prompt must be a string or have an instruction / question / prompt")
        prompts.append(value)
    if not prompts:
        raise InputError(f"{path}: expected a non-empty list of prompts")
    return prompts


#: A sentinel system message: what a template writes before the user turn is found by rendering it alone.
_SYSTEM_PROBE = [{"role": "system", "content": "LUNAR-SYSTEM-PROBE"}]


def lunar_prompt(tokenizer, question: str, fmt: dict, row: dict | None = None) -> tuple[str, bool]:
    """(text, add_special_tokens) of `question`'s prompt as LUNAR's code writes it: its templates hold the user turn
    and the assistant header alone, with no system turn (src/model_utils/llama3_model.py, qwen_model.py, ...
    `format_instruction_*_chat` with system=None; src/data_loader.py), tokenized with add_special_tokens=True (the
    BOS they leave out). Here: the evaluation's user turn (`Benchmark.chat_turns`: the question; RWKU's probe)
    through the model's chat template, less whatever the template writes before it, a system turn of its own
    included (SmolLM2's and Qwen2.5's templates add a default one, Llama 3.1's a date). A prompt the evaluation
    writes without a chat template (plain, a model family's tags) stays the evaluation's."""
    from ..prompts import question_benchmark, render_chat, writes_chat

    keys = row_prompt(row) if row else {}
    if not writes_chat(tokenizer, **{k: fmt[k] for k in ("preset", "family", "chat", "benchmark") if k in fmt}):
        texts = qa_texts(tokenizer, question, "", **fmt, **keys)
        return texts.prompt, texts.add_special_tokens
    plugin = question_benchmark(fmt.get("benchmark"))
    spec = plugin.chat_turns(question, **keys) if plugin is not None else None
    turns, render = spec or ([{"role": "user", "content": question}], dict(add_generation_prompt=True))
    from jinja2.exceptions import TemplateError

    try:
        head = render_chat(tokenizer, _SYSTEM_PROBE, add_generation_prompt=False)
        whole = render_chat(tokenizer, _SYSTEM_PROBE + turns, **render)
    except TemplateError:   # a template without a system role (Gemma's): what it writes has none
        head = whole = ""
    if head and whole.startswith(head):
        return whole[len(head):], True
    return render_chat(tokenizer, turns, **render), False   # the template's own text, its BOS included


def prompt_ids(tokenizer, question: str, fmt: dict, row: dict | None = None, style: str = "evaluation") -> list[int]:
    """The token ids of `question`'s prompt: as training and evaluation write it (`prompts.qa_texts`), or with
    `style` "lunar" as LUNAR's code does (`lunar_prompt`)."""
    if style == "lunar":
        prompt, special = lunar_prompt(tokenizer, question, fmt, row)
    else:
        texts = qa_texts(tokenizer, question, "", **fmt, **(row_prompt(row) if row else {}))
        prompt, special = texts.prompt, texts.add_special_tokens
    return list(tokenizer(prompt, add_special_tokens=special)["input_ids"])


@torch.no_grad()
def mean_last_prompt_activation(model, prompts: list[list[int]], layer: int) -> torch.Tensor:
    """Mean over `prompts` (token ids) of block `layer`'s output at each prompt's last token (float64), one
    prompt at a time (no padding, as LUNAR's batches of 1)."""
    device = next(model.parameters()).device
    total = None
    for ids in prompts:
        inputs = {"input_ids": torch.tensor([ids], device=device),
                  "attention_mask": torch.ones(1, len(ids), dtype=torch.long, device=device)}
        last = block_output(model, inputs, layer, grad=False)[0, -1].double()
        total = last if total is None else total + last
    return total / len(prompts)


def forget_prompt_ids(dataset, max_length: int, style: str = "evaluation") -> list[list[int]]:
    """The forget rows' questions as token ids, as training and evaluation write them (`prompt_ids`), each cut at
    `max_length`."""
    prompts = []
    for i, row in enumerate(dataset.forget_rows):
        question = row_to_qa(row, i, "forget")[0]
        if not question:
            raise InputError("lunar redirects question prompts: forget rows must have a question (not text)")
        prompts.append(prompt_ids(dataset.tokenizer, question, dataset.format, row, style)[:max_length])
    return prompts


def retain_prompt_ids(dataset, max_length: int, style: str = "evaluation") -> list[list[int]]:
    """The retain rows' questions as token ids (a row without one, a passage, as the trainer encodes it), each cut
    at `max_length`."""
    prompts = []
    for i, row in enumerate(dataset.retain_rows):
        question = row_to_qa(row, i, "retain")[0]
        prompts.append((prompt_ids(dataset.tokenizer, question, dataset.format, row, style) if question
                        else list(dataset.retain[i].input_ids))[:max_length])
    return prompts


@torch.no_grad()
def down_projection_pairs(model, projection, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, d_in] inputs and [N, d_out] outputs of `projection` (a block's MLP down projection) at every token of
    `prompts`, one prompt at a time (no padding, as LUNAR's batches of 1), in the activations' dtype."""
    device = next(model.parameters()).device
    inputs, outputs = [], []

    def hook(_module, args, output):
        inputs.append(args[0].reshape(-1, args[0].shape[-1]))
        outputs.append(output.reshape(-1, output.shape[-1]))

    handle = projection.register_forward_hook(hook)
    try:
        for ids in prompts:
            model(input_ids=torch.tensor([ids], device=device),
                  attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device))
    finally:
        handle.remove()
    return torch.cat(inputs), torch.cat(outputs)


def token_mse(prediction: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Mean over the batch's tokens of weight * (mean over coordinates of the squared error): with every weight 1,
    torch's MSELoss (LUNAR's criterion)."""
    return ((prediction - target).pow(2).mean(-1) * weight).mean()


def fit_projection(weight: torch.Tensor, bias: torch.Tensor | None, inputs: torch.Tensor, targets: torch.Tensor,
                   token_weights: torch.Tensor, *, learning_rate: float, weight_decay: float, lr_decay: float,
                   num_epochs: int, batch_size: int, seed: int, on_step=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """LUNAR's fit (src/estimated_net_utils.py `train`) of a linear map initialised at (`weight`, `bias`), in
    float32: DataLoader(shuffle=True) over the token examples, AdamW, ExponentialLR(lr_decay) every epoch.
    `on_step(epoch, loss, lr)` after each step. Returns the fitted (weight, bias)."""
    from torch.utils.data import DataLoader, TensorDataset

    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device,
                             dtype=torch.float32)
    with torch.no_grad():
        linear.weight.copy_(weight.float())
        if bias is not None:
            linear.bias.copy_(bias.float())
    optimizer = torch.optim.AdamW(linear.parameters(), lr=learning_rate, weight_decay=weight_decay)
    # The training engine in place (the projection beside the model, in this process), decayed once an epoch.
    from ..training.engine import Engine   # here: listing the methods must not import accelerate

    engine = Engine(linear, optimizer, torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=lr_decay),
                    scheduler_interval="epoch")
    loader = DataLoader(TensorDataset(inputs, targets, token_weights), batch_size=batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))

    def loss_fn(batch):
        x, y, w = (t.to(weight.device).float() for t in batch)
        loss = token_mse(linear(x), y, w)
        return loss, {"loss": float(loss.detach())}

    for epoch in range(num_epochs):
        for batch in loader:
            logs = engine.step([batch], loss_fn)
            if on_step is not None:
                on_step(epoch, logs["loss"], logs["lr"])
        engine.end_epoch()
    return linear.weight.detach(), None if bias is None else linear.bias.detach()


@register_method
class LUNAR(UnlearningMethod):
    name = "lunar"
    Config = LUNARConfig
    needs_ref = False   # the fit reads the starting model's activations before changing anything
    needs_retain = True
    direction: torch.Tensor | None = None

    def _down_projection(self, model):
        return mlp_down_projection(decoder_block(model, self.config.layer), self.config.layer)

    def trained_weights(self) -> str:
        return f"block {self.config.layer}'s MLP down projection"

    def trainable_parameters(self, model):
        path, blocks = find_decoder_blocks(model)
        decoder_block(model, self.config.layer)   # a clear error for a layer the model lacks
        target = self._down_projection(model)
        block = blocks[self.config.layer]
        name = next(n for n, m in block.named_modules() if m is target)
        return [f"{path}.{self.config.layer}.{name}.weight"]

    def prepare(self, model, seed: int, dataset=None) -> None:
        """The refusal direction r at `layer`, from the starting model (before any step)."""
        if self.config.refusal_prompts_path is None:
            raise InputError("lunar needs prompts the model refuses (LUNAR's dataset/splits/harmful.json): set "
                             "refusal_prompts_path")
        if dataset is None:
            raise ValueError("lunar.prepare needs the training dataset (its forget prompts)")
        style = self.config.prompt_style
        refusal = [prompt_ids(dataset.tokenizer, q, dataset.format, style=style)
                   for q in read_prompts(self.config.refusal_prompts_path)]
        forget = forget_prompt_ids(dataset, self.config.max_length, style)
        self.set_direction(mean_last_prompt_activation(model, refusal, self.config.layer)
                           - mean_last_prompt_activation(model, forget, self.config.layer))

    def set_direction(self, direction: torch.Tensor) -> None:
        self.direction = direction.float().cpu()

    def fit(self, model, dataset, *, seed: int, progress: bool):
        """LUNAR's fit of the down projection on the starting model's cached activations (module doc)."""
        from tqdm.auto import tqdm

        from ..training.engine import TrainResult

        if self.direction is None:
            raise RuntimeError("lunar: call prepare(model, seed, dataset) first (the trainer does) for the direction")
        cfg = self.config
        projection = self._down_projection(model)
        forget = forget_prompt_ids(dataset, cfg.max_length, cfg.prompt_style)
        retain = retain_prompt_ids(dataset, cfg.max_length, cfg.prompt_style) if self.uses_retain else []
        was_training = model.training
        model.eval()
        x_forget, y_forget = down_projection_pairs(model, projection, forget)
        shift = (cfg.coeff * self.direction).to(y_forget.device, y_forget.dtype)
        pieces = [(x_forget, y_forget + shift, cfg.forget_weight)]
        if retain:
            pieces.append((*down_projection_pairs(model, projection, retain), cfg.alpha))
        inputs = torch.cat([x for x, _, _ in pieces])
        targets = torch.cat([y for _, y, _ in pieces])
        weights = torch.cat([torch.full((len(x),), float(w), device=x.device) for x, _, w in pieces])
        n_forget = len(x_forget)

        result = TrainResult(model=model)
        steps = -(-len(inputs) // cfg.token_batch_size) * cfg.num_epochs
        bar = tqdm(total=steps, desc=f"unlearn[{self.name}] fit", disable=not progress, dynamic_ncols=True)

        def on_step(epoch, loss, lr):
            result.optimizer_steps += 1
            result.history.append({"loss": loss, "lr": lr, "epoch": epoch, "step": result.optimizer_steps})
            bar.update(1)

        weight, bias = fit_projection(
            projection.weight, projection.bias, inputs, targets, weights, learning_rate=cfg.learning_rate,
            weight_decay=cfg.weight_decay, lr_decay=cfg.lr_decay, num_epochs=cfg.num_epochs,
            batch_size=cfg.token_batch_size, seed=seed, on_step=on_step)
        bar.close()
        with torch.no_grad():
            projection.weight.copy_(weight.to(projection.weight.dtype))
            if bias is not None:
                projection.bias.copy_(bias.to(projection.bias.dtype))
            # in chunks: at a 7B model's width all the tokens' inputs in float32 would be gigabytes more
            errors = torch.cat([
                (x.to(weight.device).float() @ weight.T + (0 if bias is None else bias)
                 - y.to(weight.device).float()).pow(2).mean(-1)
                for x, y in zip(inputs.split(4096), targets.split(4096))])
        result.final_logs = {**(result.history[-1] if result.history else {}),
                             "lunar_forget": float(errors[:n_forget].mean()), "forget_tokens": n_forget,
                             "retain_tokens": len(inputs) - n_forget}
        if len(inputs) > n_forget:
            result.final_logs["lunar_retain"] = float(errors[n_forget:].mean())
        model.train(was_training)
        return result


class LUNARMethod(BaselineMethod):
    def cost(self, cell) -> str:
        """LUNAR's steps follow the prompts' token count (known once tokenized), not the rows: say how they arise."""
        cfg = self.cell_config(cell)
        retain = " and retain" if cfg.alpha > 0 else ""
        return (f"{cfg.num_epochs:g} epochs of LUNAR's fit on cached activations: every forget{retain} prompt "
                f"token one example, shuffled batches of {cfg.token_batch_size} tokens")


#: The runner's view of it (entry point `cru_harness.methods`: LUNAR).
METHOD = LUNARMethod(LUNAR, "LUNAR",
                        "one layer's MLP output on forget inputs redirected toward refusal activations",
                        needs_qa_rows=True, order=54, needs=("refusal_prompts_path (LUNAR's harmful.json)",),
                        # LUNAR's prompt on every benchmark, in each cell's hyperparameters; the evaluation's before
                        benchmark_defaults={"*": {"prompt_style": "lunar"}},
                        former_defaults={"prompt_style": "evaluation"})
