"""Cached tiny checkpoints that know a fictitious TOFU-schema world: the testbed's model zoo.

`tiny_checkpoint(arch, variant)` returns a directory `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` load (and lm-eval's `hf` / `cru` models take as `pretrained=`):

- "finetuned": trained on the whole world (`full`) plus the world's general facts (utility sets) -- the model
  an unlearning method starts from;
- "retain":    TOFU's oracle, the same recipe trained on `retain90` plus the utility sets only;
- "random":    the same architecture and tokenizer, untrained.

Everything is built once and cached under `$CRU_HARNESS_CACHE` (default `~/.cache/cru_harness`) in a directory
named by a hash of the recipe and of the code that builds it (`builder_fingerprint`), so changing a recipe field
or that code builds a new entry instead of reusing one an older version built. A build gives the same bytes at
any torch thread count (tests/test_reproducibility.py); it runs at a fixed count anyway (`_build_threads`). Builds happen in a temporary directory renamed into place, under a file lock, so a
killed build never leaves a half-written checkpoint and concurrent callers build it only once.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..errors import InputError
from .finetune import finetune_causal_lm, format_qa
from .models import TINY_ARCHITECTURES, build_tiny_model, save_tiny_model
from .tokenizer import train_tokenizer
from .world import make_world, write_tofu_layout

# Bump when code changes would change what a recipe builds (world templates, training loop, tokenizer...).
RECIPE_VERSION = 2  # 2: Qwen2-style pre-tokenisation for every family
VARIANTS = ("finetuned", "retain", "random")
RECIPE_FILE = "testbed_recipe.json"


@dataclass(frozen=True)
class WorldRecipe:
    n_authors: int = 20
    qa_per_author: int = 20
    n_real_authors: int = 20
    n_world_facts: int = 20
    seed: int = 0


@dataclass(frozen=True)
class ModelRecipe:
    """Everything that determines a tiny checkpoint. 8 layers so that "the last 4 blocks" is half the net."""
    arch: str = "llama"
    variant: str = "finetuned"
    n_layers: int = 8
    hidden_size: int = 128
    vocab_size: int = 2048
    chat_template: bool = True
    # Measured on the default world (llama, 2.5M parameters, ~2 min on one thread of a busy 2-core machine):
    # 20 epochs at 3e-3 end at answer loss 0.05 with greedy ROUGE-L recall 1.0 on forget10, 0.99 on retain,
    # 0.98 on the utility facts. 14 epochs at 4e-3 ended at loss 0.18 with forget/retain 0.93/0.94 but only
    # 0.62 on the utility facts (short answers are all-or-nothing): too weak a utility baseline.
    epochs: int = 20
    lr: float = 3e-3
    batch_size: int = 16
    max_length: int = 128
    answer_only_loss: bool = True
    train_seed: int = 0


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else `$CRU_HARNESS_CACHE`, else `~/.cache/cru_harness`."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("CRU_HARNESS_CACHE") or Path.home() / ".cache" / "cru_harness")


@functools.lru_cache(maxsize=1)
def builder_fingerprint() -> str:
    """Content hash of the code a build runs (world, tokenizer, model, fine-tuning, the QA template, the build
    itself), comments ignored: a cache entry built by other code is never reused, even without a version bump."""
    from ..data import corpora
    from ..fingerprints import file_digest
    from . import finetune, models, tokenizer, world

    digest = hashlib.sha256()
    for module in (world, tokenizer, models, finetune):
        digest.update(file_digest(module.__name__ + ".py", Path(module.__file__)).encode())
    for function in (corpora.format_qa, tiny_checkpoint, tiny_world_dir):
        digest.update(hashlib.sha256(inspect.getsource(function).encode()).hexdigest().encode())
    return digest.hexdigest()[:16]


def recipe_hash(*parts) -> str:
    """Short stable hash of the recipe dataclasses plus `RECIPE_VERSION`, `builder_fingerprint()` and the
    transformers / tokenizers versions (a tokenizer saved by transformers 5 names a class 4.x cannot load, so two
    environments sharing one cache must not share its entries): the cache entry's name."""
    import tokenizers
    import transformers

    payload = json.dumps([RECIPE_VERSION, builder_fingerprint(), transformers.__version__, tokenizers.__version__,
                          *[asdict(p) if hasattr(p, "__dataclass_fields__") else p for p in parts]], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive lock (`filelock`) so parallel processes asking for the same entry build it once. A wait says
    so: a build left running by a killed run can hold it for minutes."""
    from filelock import Timeout

    from ..locations import file_lock

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = file_lock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        entry = path.name.removeprefix(".").removesuffix(".lock")
        print(f"waiting for another process building {entry} in {path.parent} (lock {path})", file=sys.stderr)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def build_cached(final_dir: Path, build) -> Path:
    """Return `final_dir`, first calling `build(tmp_dir)` and renaming tmp -> final if it does not exist yet.

    A finished entry always contains `RECIPE_FILE` (written last by `build`), so a directory without it is
    never trusted. Shared by the tiny zoo and `smollm.materialize_smollm2`.
    """
    if (final_dir / RECIPE_FILE).is_file():
        return final_dir
    with _file_lock(final_dir.parent / f".{final_dir.name}.lock"):
        if (final_dir / RECIPE_FILE).is_file():  # another process built it while we waited
            return final_dir
        if final_dir.exists():  # a leftover without the marker: not a finished build
            shutil.rmtree(final_dir)
        # Temp dirs of killed builds (SIGKILL/SIGTERM skip cleanup); safe to remove while we hold the lock.
        for stale in final_dir.parent.glob(f".{final_dir.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.tmp-", dir=final_dir.parent))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is meant to be shared
        try:
            build(tmp)
            if not (tmp / RECIPE_FILE).is_file():
                raise RuntimeError(f"internal error: build of {final_dir.name} did not write {RECIPE_FILE}")
            os.rename(tmp, final_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final_dir


@contextlib.contextmanager
def _build_threads():
    """Build with one torch thread, whatever the process uses, restoring its count afterwards.

    One thread makes the bytes independent of the machine's core count: on an AVX-512 CPU a two-thread build of
    the same recipe gave other weights (tests/test_reproducibility.py), and the cache names a checkpoint by its
    recipe alone. It is also faster: tiny models are dominated by per-op overhead, and on a shared 2-core machine
    one thread trained the default recipe ~7x faster (4.3 vs 0.6 steps/s) than two threads fighting for the
    cores. The count and the CPU's vector instruction set are recorded in the recipe file.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _write_recipe(out_dir: Path, record: dict) -> None:
    (out_dir / RECIPE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def tiny_world_dir(*, world_seed: int = 0, cache_dir: str | os.PathLike | None = None,
                   world: WorldRecipe | None = None) -> Path:
    """The fictitious world in the Hub's TOFU layout (pass it as `data_dir` to the TOFU loaders), cached."""
    world = world or WorldRecipe(seed=world_seed)
    final = cache_root(cache_dir) / "testbed" / f"world-{recipe_hash(world)}"
    final.parent.mkdir(parents=True, exist_ok=True)

    def build(tmp: Path) -> None:
        write_tofu_layout(make_world(**asdict(world)), tmp)
        _write_recipe(tmp, {"recipe_version": RECIPE_VERSION, "builder_fingerprint": builder_fingerprint(),
                            "world": asdict(world)})

    return build_cached(final, build)


def tiny_checkpoint(arch: str = "llama", variant: str = "finetuned", *, world_seed: int = 0,
                    cache_dir: str | os.PathLike | None = None, recipe: ModelRecipe | None = None,
                    world: WorldRecipe | None = None, progress: bool = False) -> Path:
    """Path to a cached tiny HF checkpoint (model + tokenizer) of family `arch`; built on first use.

    `recipe`/`world` override the defaults (their `arch`/`variant`/`seed` are replaced by the arguments).
    The directory also holds `testbed_recipe.json` (recipe, fine-tuning time and losses) and `world_dir`.
    """
    if arch not in TINY_ARCHITECTURES:
        raise InputError(f"unknown tiny architecture {arch!r}; choose one of {', '.join(TINY_ARCHITECTURES)}")
    if variant not in VARIANTS:
        raise InputError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    world = WorldRecipe(**{**asdict(world or WorldRecipe()), "seed": world_seed})
    recipe = ModelRecipe(**{**asdict(recipe or ModelRecipe()), "arch": arch, "variant": variant})
    root = cache_root(cache_dir) / "testbed"
    final = root / f"{arch}-{variant}-{recipe_hash(world, recipe)}"
    root.mkdir(parents=True, exist_ok=True)

    def build(tmp: Path) -> None:
        with _build_threads():
            _build_checkpoint(tmp)

    def _build_checkpoint(tmp: Path) -> None:
        world_obj = make_world(**asdict(world))
        tokenizer = train_tokenizer(world_obj.all_text(), recipe.vocab_size, chat_template=recipe.chat_template)
        model = build_tiny_model(arch, tokenizer, seed=recipe.train_seed, n_layers=recipe.n_layers,
                                 hidden_size=recipe.hidden_size, max_positions=max(512, recipe.max_length))
        record = {"recipe_version": RECIPE_VERSION, "world": asdict(world), "recipe": asdict(recipe),
                  "n_parameters": sum(p.numel() for p in model.parameters()), "torch": torch.__version__,
                  "torch_threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                  "builder_fingerprint": builder_fingerprint()}
        if variant != "random":
            rows = world_obj.training_rows(variant)
            started = time.perf_counter()
            stats = finetune_causal_lm(model, tokenizer, [format_qa(r["question"], r["answer"]) for r in rows],
                                       epochs=recipe.epochs, lr=recipe.lr, batch_size=recipe.batch_size,
                                       max_length=recipe.max_length, seed=recipe.train_seed,
                                       answer_only_loss=recipe.answer_only_loss, progress=progress)
            record.update(n_training_rows=len(rows), finetune_seconds=round(time.perf_counter() - started, 1),
                          epoch_losses=[round(x, 4) for x in stats.epoch_losses])
        save_tiny_model(model, tokenizer, tmp)
        record["world_dir"] = str(tiny_world_dir(world=world, cache_dir=cache_dir))
        _write_recipe(tmp, record)

    return build_cached(final, build)


def checkpoint_record(checkpoint_dir: str | os.PathLike) -> dict:
    """The recipe and build statistics saved next to a tiny checkpoint."""
    return json.loads((Path(checkpoint_dir) / RECIPE_FILE).read_text())
