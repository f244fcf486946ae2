"""`RouterBundle`: the artifact a user ships -- like a PEFT adapter, a directory holding a JSON manifest
(`cru_bundle.json`) and safetensors weights (`routers.safetensors`), never pickle.

The manifest is deterministic (sorted keys, no timestamps), so the same training seed gives identical bytes.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from . import blocks as _blocks
from .router import Router

FORMAT_VERSION = 1
MANIFEST_NAME = "cru_bundle.json"
WEIGHTS_NAME = "routers.safetensors"


class BundleError(ValueError):
    """Base class of every router-bundle problem (a user error, reported without a deep trace)."""


class BundleFileError(BundleError):
    """The bundle directory, manifest or weights file is missing, truncated or corrupt."""


class UnsupportedFormatError(BundleError):
    """The manifest's format version is not one this library reads."""


class IncompatibleBaseError(BundleError):
    """The bundle was made for a different base model."""


class HiddenSizeMismatchError(IncompatibleBaseError):
    pass


class LayerCountMismatchError(IncompatibleBaseError):
    pass


class FingerprintMismatchError(IncompatibleBaseError):
    pass


class WeightShapeError(BundleError):
    """The weights file does not match the shapes the manifest declares."""


def base_fingerprint(model: nn.Module) -> dict:
    """What a bundle must match: architecture, hidden size, layer count, vocab size, and a hash of them."""
    fingerprint = {
        "architecture": _blocks.model_type(model),
        "hidden_size": _blocks.hidden_size(model),
        "num_layers": _blocks.num_layers(model),
        "vocab_size": _blocks.vocab_size(model),
    }
    fingerprint["hash"] = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    return fingerprint


def library_versions() -> dict:
    import safetensors
    import transformers

    from importlib.metadata import PackageNotFoundError, version
    try:
        own = version("cru-harness")
    except PackageNotFoundError:
        own = "unknown"
    return {"cru_harness": own, "torch": torch.__version__.split("+")[0],
            "transformers": transformers.__version__, "safetensors": safetensors.__version__}


@dataclass
class BundleConfig:
    """Everything the manifest records about a bundle (see `cru_method.md`, "The router bundle")."""
    base_model: str
    fingerprint: dict
    block_indices: list[int]
    neurons: dict[int, list[int]]
    d_r: int
    percentile: float
    lam: float
    seed: int
    selection: str = "variance"
    input_norm: str = "none"
    training_data: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)     # lr, epochs, batch size, max length, steps
    metrics: dict = field(default_factory=dict)      # final forget/retain gate means, loss
    router_parameters: int = 0
    base_parameters: int = 0
    library_versions: dict = field(default_factory=library_versions)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        data = asdict(self)
        data["neurons"] = {str(block): list(map(int, idx)) for block, idx in sorted(self.neurons.items())}
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict, source: str = "manifest") -> "BundleConfig":
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise UnsupportedFormatError(
                f"{source}: format_version {version!r} is not supported (this library reads version "
                f"{FORMAT_VERSION}); upgrade cru-harness or re-create the bundle")
        known = {f.name for f in fields(cls)}
        required = {"base_model", "fingerprint", "block_indices", "neurons", "d_r", "percentile", "lam", "seed"}
        missing = sorted(required - data.keys())
        if missing:
            raise BundleFileError(f"{source}: missing field(s) {', '.join(missing)}")
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["neurons"] = {int(block): list(idx) for block, idx in data["neurons"].items()}
        kwargs["block_indices"] = [int(b) for b in data["block_indices"]]
        return cls(**kwargs)


class RouterBundle(nn.Module):
    """A set of routers (one per gated block) plus the `BundleConfig` that says where they act."""

    def __init__(self, config: BundleConfig, routers: dict[int, Router] | None = None):
        super().__init__()
        self.config = config
        if set(config.neurons) != set(config.block_indices):
            raise BundleError(f"neuron indices given for blocks {sorted(config.neurons)} but the bundle gates "
                              f"blocks {config.block_indices}")
        hidden = config.fingerprint["hidden_size"]
        if routers is None:
            routers = {block: Router(hidden, len(config.neurons[block]), config.d_r, input_norm=config.input_norm)
                       for block in config.block_indices}
        self.routers = nn.ModuleDict({str(block): routers[block] for block in config.block_indices})
        for block in config.block_indices:
            self.register_buffer(f"neurons_{block}", torch.tensor(config.neurons[block], dtype=torch.long),
                                 persistent=False)

    def router(self, block: int) -> Router:
        return self.routers[str(block)]

    def neuron_indices(self, block: int) -> torch.Tensor:
        return getattr(self, f"neurons_{block}")

    @property
    def block_indices(self) -> list[int]:
        return list(self.config.block_indices)

    def num_router_parameters(self) -> int:
        return sum(p.numel() for p in self.routers.parameters())

    # -- compatibility -------------------------------------------------------------------------------------
    def check_compatible(self, model: nn.Module) -> None:
        """Raise a specific `IncompatibleBaseError` if this bundle was not made for `model`'s architecture."""
        expected = self.config.fingerprint
        actual = base_fingerprint(model)
        if expected.get("hidden_size") != actual["hidden_size"]:
            raise HiddenSizeMismatchError(
                f"bundle was made for hidden size {expected.get('hidden_size')}, the model has "
                f"{actual['hidden_size']} (base of the bundle: {self.config.base_model})")
        if expected.get("num_layers") != actual["num_layers"]:
            raise LayerCountMismatchError(
                f"bundle was made for a model with {expected.get('num_layers')} layers, the model has "
                f"{actual['num_layers']} (base of the bundle: {self.config.base_model})")
        if expected.get("hash") != actual["hash"]:
            diffs = [f"{k}: bundle {expected.get(k)!r} vs model {actual[k]!r}"
                     for k in ("architecture", "vocab_size") if expected.get(k) != actual[k]]
            raise FingerprintMismatchError(
                f"bundle fingerprint {expected.get('hash')} does not match the model's {actual['hash']} "
                f"({'; '.join(diffs) or 'fingerprint fields differ'}); it was made for {self.config.base_model}")

    # -- persistence ---------------------------------------------------------------------------------------
    def _state_tensors(self) -> dict[str, torch.Tensor]:
        tensors = {}
        for block in self.config.block_indices:
            router = self.router(block)
            for name, tensor in router.state_dict().items():
                tensors[f"block_{block}.{name}"] = tensor.detach().to("cpu", torch.float32).contiguous()
        return tensors

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write `cru_bundle.json` + `routers.safetensors` into `directory` (created if needed)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = self._state_tensors()
        weights_path = directory / WEIGHTS_NAME
        # A single metadata key: safetensors writes metadata from a hash map, so several keys come out in random
        # order and the same bundle would not give identical bytes.
        save_file(tensors, str(weights_path), metadata={"format": "pt"})
        self.config.router_parameters = self.num_router_parameters()
        manifest = json.loads(self.config.to_json())
        manifest["weights_file"] = WEIGHTS_NAME
        manifest["weights_sha256"] = hashlib.sha256(weights_path.read_bytes()).hexdigest()
        (directory / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | Path, model: nn.Module | None = None) -> "RouterBundle":
        """Load a bundle; with `model`, also `check_compatible(model)`. Errors are `BundleError` subclasses."""
        directory = Path(directory)
        manifest = read_manifest(directory)
        config = BundleConfig.from_dict(manifest, source=str(directory / MANIFEST_NAME))
        weights_path = directory / manifest.get("weights_file", WEIGHTS_NAME)
        if not weights_path.is_file():
            raise BundleFileError(f"router weights file {weights_path} is missing")
        expected_hash = manifest.get("weights_sha256")
        if expected_hash and hashlib.sha256(weights_path.read_bytes()).hexdigest() != expected_hash:
            raise BundleFileError(f"router weights file {weights_path} is truncated or corrupt "
                                  "(its SHA-256 differs from the manifest's)")
        try:
            tensors = load_file(str(weights_path))
        except (SafetensorError, OSError, ValueError) as err:
            raise BundleFileError(f"router weights file {weights_path} cannot be read ({err})") from None
        hidden = config.fingerprint.get("hidden_size")
        routers = {}
        for block in config.block_indices:
            n_selected = len(config.neurons[block])
            expected = {"w1.weight": (config.d_r, hidden), "w1.bias": (config.d_r,),
                        "w2.weight": (n_selected, config.d_r), "w2.bias": (n_selected,)}
            state = {}
            for name, shape in expected.items():
                key = f"block_{block}.{name}"
                if key not in tensors:
                    raise WeightShapeError(f"{weights_path}: tensor {key} is missing")
                if tuple(tensors[key].shape) != shape:
                    raise WeightShapeError(f"{weights_path}: tensor {key} has shape {tuple(tensors[key].shape)}, "
                                           f"the manifest implies {shape}")
                state[name] = tensors[key]
            router = Router(hidden, n_selected, config.d_r, input_norm=config.input_norm)
            router.load_state_dict(state)
            routers[block] = router
        expected_keys = {f"block_{b}.{n}" for b in config.block_indices for n in ("w1.weight", "w1.bias",
                                                                                 "w2.weight", "w2.bias")}
        extra = sorted(set(tensors) - expected_keys)
        if extra:
            raise WeightShapeError(f"{weights_path}: unexpected tensors {', '.join(extra[:5])} "
                                   "not described by the manifest")
        bundle = cls(config, routers).eval()
        if model is not None:
            bundle.check_compatible(model)
        return bundle


def read_manifest(directory: str | Path) -> dict:
    """The parsed `cru_bundle.json` of a bundle directory (a `BundleFileError` if absent or not JSON)."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if not directory.is_dir():
        raise BundleFileError(f"router bundle directory {directory} does not exist")
    if not path.is_file():
        raise BundleFileError(f"{directory} is not a router bundle: {MANIFEST_NAME} is missing")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BundleFileError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(manifest, dict):
        raise BundleFileError(f"{path} does not hold a JSON object")
    return manifest
