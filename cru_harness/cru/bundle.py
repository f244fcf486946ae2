"""`RouterBundle`: the artifact a user ships -- like a PEFT adapter, a directory holding a JSON manifest
(`cru_bundle.json`) and safetensors weights (`routers.safetensors`), never pickle.

The manifest is deterministic (sorted keys, no timestamps), so the same training seed gives identical bytes.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import UserError, excerpt
from ..locations import BUNDLE_MANIFEST
from ..training import blocks as _blocks
from .losses import LOSS_SHAPES
from .readings import BLOCK_OUTPUTS, LOCALIZATION_TOKENS, TOKEN_SCOPES
from .router import INPUT_NORMS, Router
from ..training.sites import GATE_SITES

FORMAT_VERSION = 1
MANIFEST_NAME = BUNDLE_MANIFEST
WEIGHTS_NAME = "routers.safetensors"


class BundleError(UserError, ValueError):
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


#: Elements of one base weight matrix a manifest records (`sample_base_weights`): another base of the same shape
#: (the released model where the routers were trained on its fine-tune) passes every structural check.
WEIGHT_SAMPLE_SIZE = 256


class BaseWeightsWarning(UserWarning):
    """The routers are attached to a base whose weights differ from the one they were trained on."""


def _sampled_elements(param: torch.Tensor) -> torch.Tensor:
    """`param`'s elements at evenly spaced positions of its flat view, the positions in integers (a float linspace
    could place them differently in another torch)."""
    flat = param.detach().reshape(-1)
    count = min(WEIGHT_SAMPLE_SIZE, flat.numel())
    positions = [i * (flat.numel() - 1) // max(count - 1, 1) for i in range(count)]
    return flat[torch.tensor(positions, dtype=torch.long, device=flat.device)]


def sample_base_weights(model: nn.Module, block_index: int) -> dict:
    """Evenly spaced elements of block `block_index`'s first weight matrix, as floats, with the dtype they had:
    what `base_weights_problem` compares another base with. Empty where there is none to read (meta weights)."""
    _, blocks = _blocks.find_decoder_blocks(model)
    for name, param in blocks[block_index].named_parameters():
        if param.is_floating_point() and param.dim() >= 2 and param.device.type != "meta":
            values = _sampled_elements(param).float().cpu().tolist()
            return {"block": int(block_index), "parameter": name, "numel": int(param.numel()),
                    "dtype": str(param.dtype).removeprefix("torch."), "values": values}
    return {}


def base_weights_problem(sample: dict, model: nn.Module) -> str | None:
    """How `model`'s weights differ from the `sample` a bundle recorded of its own base, or None (they match, or
    cannot be compared: no sample, another structure, weights not in memory, quantized, fp16 against bf16).
    Both sides are compared in the coarser of the two dtypes, exactly: a cast of the same base rounds the same
    way, while a fine-tune of it moves some weights across a rounding step."""
    if not sample:
        return None
    _, blocks = _blocks.find_decoder_blocks(model)
    if not 0 <= sample["block"] < len(blocks):
        return None
    param = dict(blocks[sample["block"]].named_parameters()).get(sample["parameter"])
    recorded = getattr(torch, str(sample.get("dtype")), None)
    if param is None or not param.is_floating_point() or param.device.type == "meta" or \
            param.numel() != sample["numel"] or not isinstance(recorded, torch.dtype):
        return None
    dtypes = sorted({recorded, param.dtype}, key=lambda d: torch.finfo(d).eps)
    if len(dtypes) == 2 and torch.finfo(dtypes[0]).bits == torch.finfo(dtypes[1]).bits:
        return None   # float16 against bfloat16: neither holds the other's values
    coarse = dtypes[-1]
    ours = _sampled_elements(param).to(coarse).cpu()
    theirs = torch.tensor(sample["values"], dtype=torch.float32).to(coarse)
    differ = int((ours != theirs).sum()) if ours.shape == theirs.shape else len(sample["values"])
    if not differ:
        return None
    return (f"{differ} of {len(sample['values'])} sampled weights of block {sample['block']} "
            f"({sample['parameter']}) differ from those of the base the routers were trained on")


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
    # Options beyond the paper (`RouterTrainingConfig`); a manifest without them is a paper-setting bundle.
    suppress_loss: str = "linear"
    pass_loss: str = "quadratic"
    exclude_top_magnitude: float = 0.0
    gate_site: str = "residual"
    site_width: int | None = None      # coordinates per block at gate_site (None: the hidden size)
    excluded: dict[int, list[int]] = field(default_factory=dict)  # per block: coordinates kept out of selection
    base_weights: dict = field(default_factory=dict)  # `sample_base_weights` of the base (absent: not recorded)
    # Readings the paper leaves open (`readings.py`); written to the manifest only when not the default, so a
    # default bundle's manifest is the one written before they existed.
    token_scope: str = "all"
    answer_marker: list[int] = field(default_factory=list)   # token_scope="answer": the prompt's end marker
    localization_tokens: str = "all"
    block_output: str = "block"
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
        data["excluded"] = {str(block): list(map(int, idx)) for block, idx in sorted(self.excluded.items())}
        for name, default in _READING_DEFAULTS.items():
            if data.get(name) == default:
                del data[name]
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict, source: str = "manifest") -> "BundleConfig":
        """A validated config: known format version, every required field, indices in range of the fingerprint
        (neurons index the hidden state of a block, blocks the base's decoder stack). Errors name the field."""
        version = data.get("format_version")
        if version != FORMAT_VERSION or isinstance(version, bool):
            raise UnsupportedFormatError(
                f"{source}: format_version {version!r} is not supported (this library reads version "
                f"{FORMAT_VERSION}); upgrade cru-harness or re-create the bundle")
        known = {f.name for f in fields(cls)}
        required = {"base_model", "fingerprint", "block_indices", "neurons", "d_r", "percentile", "lam", "seed"}
        missing = sorted(required - data.keys())
        if missing:
            raise BundleFileError(f"{source}: missing field(s) {', '.join(missing)}")
        check_manifest_types(data, source)
        fingerprint = data["fingerprint"]
        if not isinstance(fingerprint, dict):
            raise BundleFileError(f"{source}: fingerprint must be an object, got {fingerprint!r}")
        n_layers = _positive_int(fingerprint.get("num_layers"), "fingerprint.num_layers", source)
        hidden = _positive_int(fingerprint.get("hidden_size"), "fingerprint.hidden_size", source)
        _positive_int(data["d_r"], "d_r", source)
        input_norm = data.get("input_norm", "none")
        if input_norm not in INPUT_NORMS:
            raise BundleFileError(f"{source}: input_norm must be one of {', '.join(INPUT_NORMS)}, got {input_norm!r}")
        for name, choices in (("suppress_loss", LOSS_SHAPES), ("pass_loss", LOSS_SHAPES), ("gate_site", GATE_SITES),
                              ("token_scope", TOKEN_SCOPES), ("localization_tokens", LOCALIZATION_TOKENS),
                              ("block_output", BLOCK_OUTPUTS)):
            if name in data and data[name] not in choices:
                raise BundleFileError(f"{source}: {name} must be one of {', '.join(choices)}, got {data[name]!r}")
        exclude = data.get("exclude_top_magnitude", 0.0)
        if isinstance(exclude, bool) or not isinstance(exclude, (int, float)) or not 0 <= exclude < 100:
            raise BundleFileError(f"{source}: exclude_top_magnitude must be a percentage in [0, 100), "
                                  f"got {exclude!r}")
        marker = data.get("answer_marker", [])
        if not isinstance(marker, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                   for i in marker):
            raise BundleFileError(f"{source}: answer_marker must be a list of token ids, got {excerpt(marker)}")
        if data.get("token_scope") == "answer" and not marker:
            raise BundleFileError(f"{source}: a token_scope=answer bundle must record answer_marker (the prompt's "
                                  "end marker, by which its gates find the answer)")
        width = hidden
        if data.get("gate_site") == "mlp" and data.get("site_width") is None:
            raise BundleFileError(f"{source}: a gate_site=mlp bundle must record site_width (MLP neurons per block)")
        if data.get("site_width") is not None:
            width = _positive_int(data["site_width"], "site_width", source)
            if data.get("gate_site", "residual") == "residual" and width != hidden:
                raise BundleFileError(f"{source}: site_width {width} differs from the hidden size {hidden} of a "
                                      "residual-stream bundle")
        where = "the base's hidden size" if data.get("gate_site", "residual") == "residual" else "site_width"
        blocks = data["block_indices"]
        if not isinstance(blocks, list) or not blocks:
            raise BundleFileError(f"{source}: block_indices must be a non-empty list, got {blocks!r}")
        for block in blocks:
            _index_in_range(block, n_layers, "block index", f"the base has {n_layers} blocks", source)
        if len(set(blocks)) != len(blocks):
            raise BundleFileError(f"{source}: block_indices repeats a block: {excerpt(blocks)}")
        neurons_raw = data["neurons"]
        if not isinstance(neurons_raw, dict):
            raise BundleFileError(f"{source}: neurons must be an object {{block: [indices]}}, got {neurons_raw!r}")
        neurons = {}
        for key, indices in neurons_raw.items():
            try:
                block = int(key)
            except (TypeError, ValueError):
                raise BundleFileError(f"{source}: neurons has a key {key!r} that is not a block index") from None
            if not isinstance(indices, list) or not indices:
                raise BundleFileError(f"{source}: neurons[{key}] must be a non-empty list of indices")
            for index in indices:
                _index_in_range(index, width, "neuron index", f"{where} is {width}", source,
                                owner=f" of block {key}")
            if len(set(indices)) != len(indices):
                raise BundleFileError(f"{source}: neurons[{key}] repeats an index")
            neurons[block] = list(indices)
        if set(neurons) != set(blocks):
            raise BundleFileError(f"{source}: neuron indices are given for blocks {sorted(neurons)} but the "
                                  f"bundle gates blocks {blocks}")
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["neurons"] = neurons
        excluded = data.get("excluded") or {}
        if not isinstance(excluded, dict):
            raise BundleFileError(f"{source}: excluded must be an object {{block: [indices]}}, got {excluded!r}")
        try:
            if not all(isinstance(indices, list) for indices in excluded.values()):
                raise TypeError
            kwargs["excluded"] = {int(block): list(indices) for block, indices in excluded.items()}
        except (TypeError, ValueError):
            raise BundleFileError(f"{source}: excluded must map block indices to lists of indices") from None
        check_base_weights(data.get("base_weights", {}), n_layers, source)
        for block, indices in kwargs["excluded"].items():
            for index in indices:
                _index_in_range(index, width, "excluded index", f"{where} is {width}", source,
                                owner=f" of block {block}")
        kwargs["block_indices"] = list(blocks)
        return cls(**kwargs)


_READING_DEFAULTS = {"token_scope": "all", "answer_marker": [], "localization_tokens": "all",
                     "block_output": "block"}
_NUMBER = (int, float)
#: The type of each manifest field (what `inspect`, attaching and evaluation read). Fields checked more closely
#: further on (fingerprint, block_indices, neurons, excluded, the option names) are checked there.
MANIFEST_TYPES: dict[str, tuple] = {
    "base_model": (str,), "fingerprint": (dict,), "block_indices": (list,), "neurons": (dict,), "d_r": (int,),
    "percentile": _NUMBER, "lam": _NUMBER, "seed": (int,), "selection": (str,), "input_norm": (str,),
    "suppress_loss": (str,), "pass_loss": (str,), "exclude_top_magnitude": _NUMBER, "gate_site": (str,),
    "site_width": (int, type(None)), "excluded": (dict,), "base_weights": (dict,), "training_data": (dict,),
    "training": (dict,), "metrics": (dict,), "router_parameters": (int,), "base_parameters": (int,),
    "library_versions": (dict,), "format_version": (int,), "token_scope": (str,), "answer_marker": (list,),
    "localization_tokens": (str,), "block_output": (str,),
}   # weights_file and weights_sha256: `weights_path` and `from_pretrained` check them, saying what they must be
# Entries of the free-form records that `inspect` formats as numbers.
_NUMERIC_ENTRIES = {"metrics": ("forget_gate_mean", "retain_gate_mean", "steps", "final_loss"),
                    "training": ("epochs", "lr", "batch_size", "retain_batch_ratio")}


def _type_names(kinds: tuple) -> str:
    if kinds == _NUMBER:
        return "a number"
    return " or ".join("null" if kind is type(None) else {"dict": "an object", "list": "a list", "str": "a string",
                                                          "int": "an integer", "float": "a number"}[kind.__name__]
                       for kind in kinds)


def check_manifest_types(data: dict, source: str) -> None:
    """Refuse a manifest field of the wrong JSON type (`MANIFEST_TYPES`), naming it: a string where a number
    belongs would pass `inspect` and fail when the routers are built or a report is written."""
    import math

    for name, kinds in MANIFEST_TYPES.items():
        if name not in data:
            continue
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise BundleFileError(f"{source}: {name} must be {_type_names(kinds)}, got {excerpt(value)}")
        if isinstance(value, float) and not math.isfinite(value) and name != "format_version":
            raise BundleFileError(f"{source}: {name} must be a finite number, got {value!r}")
    for name in ("router_parameters", "base_parameters"):
        if data.get(name, 0) < 0:
            raise BundleFileError(f"{source}: {name} must not be negative, got {data[name]!r}")
    if not 0 <= data["percentile"] <= 100:
        raise BundleFileError(f"{source}: percentile must be in [0, 100], got {data['percentile']!r}")
    for record, entries in _NUMERIC_ENTRIES.items():
        for entry in entries:
            value = data.get(record, {}).get(entry)
            if value is not None and (isinstance(value, bool) or not isinstance(value, _NUMBER)):
                raise BundleFileError(f"{source}: {record}.{entry} must be a number, got {excerpt(value)}")
    for side, entry in data.get("training_data", {}).items():
        if side in ("forget", "retain") and not isinstance(entry, dict):
            raise BundleFileError(f"{source}: training_data.{side} must be an object, got {excerpt(entry)}")
    for name, version in data.get("library_versions", {}).items():
        if not isinstance(version, (str, type(None))):
            raise BundleFileError(f"{source}: library_versions.{name} must be a string, got {excerpt(version)}")
    fingerprint = data["fingerprint"]
    for name, kinds in (("architecture", (str,)), ("hash", (str,)), ("vocab_size", (int, type(None)))):
        if name in fingerprint and (isinstance(fingerprint[name], bool) or not isinstance(fingerprint[name], kinds)):
            raise BundleFileError(f"{source}: fingerprint.{name} must be {_type_names(kinds)}, got "
                                  f"{excerpt(fingerprint[name])}")


def check_base_weights(sample: dict, n_layers: int, source: str) -> None:
    """A manifest's `base_weights` (`sample_base_weights`): empty, or every entry of the right type and in range,
    so that comparing it with a base (`base_weights_problem`, when the routers are attached) cannot fail."""
    import math

    if not sample:
        return
    where = f"{source}: base_weights"
    missing = sorted({"block", "parameter", "numel", "dtype", "values"} - sample.keys())
    if missing:
        raise BundleFileError(f"{where} lacks {', '.join(missing)} (an empty object records no sample)")
    _index_in_range(sample["block"], n_layers, "base_weights.block", f"the base has {n_layers} blocks", source)
    if not isinstance(sample["parameter"], str) or not sample["parameter"]:
        raise BundleFileError(f"{where}.parameter must be a parameter name, got {excerpt(sample['parameter'])}")
    numel = _positive_int(sample["numel"], "base_weights.numel", source)
    dtype = getattr(torch, sample["dtype"], None) if isinstance(sample["dtype"], str) else None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise BundleFileError(f"{where}.dtype must name a torch floating dtype, got {excerpt(sample['dtype'])}")
    values = sample["values"]
    if not isinstance(values, list) or not 0 < len(values) <= min(numel, WEIGHT_SAMPLE_SIZE) or any(
            isinstance(v, bool) or not isinstance(v, _NUMBER) or not math.isfinite(v) for v in values):
        raise BundleFileError(f"{where}.values must be a list of 1 to {min(numel, WEIGHT_SAMPLE_SIZE)} finite "
                              f"numbers, got {excerpt(values)}")


def _positive_int(value, field_name: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BundleFileError(f"{source}: {field_name} must be a positive integer, got {value!r}")
    return value


def _index_in_range(value, size: int, what: str, why: str, source: str, owner: str = "") -> None:
    """Indices are stored non-negative: -1 would silently mean "the last one" in torch indexing."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BundleFileError(f"{source}: {what} {value!r}{owner} is not an integer")
    if not 0 <= value < size:
        raise BundleFileError(f"{source}: {what} {value}{owner} is out of range: {why} (valid: 0 to {size - 1})")


def weights_path(directory: str | Path, manifest: dict) -> Path:
    """The weights file a manifest names, confined to the bundle directory: a plain file name (no directory
    part, no `..`, not absolute), checked before anything is opened -- a bundle from elsewhere must not make
    the loader read other files."""
    name = manifest.get("weights_file", WEIGHTS_NAME)
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
            or Path(name).is_absolute() or Path(name).name != name):
        raise BundleFileError(f"{Path(directory) / MANIFEST_NAME}: weights_file must be a plain file name inside "
                              f"the bundle directory, got {name!r}")
    return Path(directory) / name


class RouterBundle(nn.Module):
    """A set of routers (one per gated block) plus the `BundleConfig` that says where they act."""

    def __init__(self, config: BundleConfig, routers: dict[int, Router] | None = None):
        super().__init__()
        self.config = config
        if set(config.neurons) != set(config.block_indices):  # a config built in code, not read from a manifest
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

    def digest(self) -> str:
        """SHA-256 of what the bundle does: its manifest fields (blocks, coordinates, settings) and router
        weights. Two bundles with one digest gate a base identically (the `cru` model's `--use_cache` check)."""
        digest = hashlib.sha256(self.config.to_json().encode())
        for name, tensor in sorted(self._state_tensors().items()):
            digest.update(f"{name}:{tuple(tensor.shape)}".encode())
            digest.update(tensor.numpy().tobytes())
        return digest.hexdigest()

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write `cru_bundle.json` + `routers.safetensors` into `directory` (created if needed)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = self._state_tensors()
        weights_file = directory / WEIGHTS_NAME
        # A single metadata key: safetensors writes metadata from a hash map, so several keys come out in random
        # order and the same bundle would not give identical bytes.
        save_file(tensors, str(weights_file), metadata={"format": "pt"})
        self.config.router_parameters = self.num_router_parameters()
        manifest = json.loads(self.config.to_json())
        manifest["weights_file"] = WEIGHTS_NAME
        manifest["weights_sha256"] = _sha256(weights_file)
        (directory / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | Path, model: nn.Module | None = None) -> "RouterBundle":
        """Load a bundle; with `model`, also `check_compatible(model)`. Errors are `BundleError` subclasses."""
        directory = Path(directory)
        manifest = read_manifest(directory)
        config = BundleConfig.from_dict(manifest, source=str(directory / MANIFEST_NAME))
        path = weights_path(directory, manifest)
        _refuse_link(path, "router weights file")
        if not path.is_file():
            raise BundleFileError(f"router weights file {path} is missing" + (
                "" if not path.exists() else " (it is not a regular file)"))
        limit = _weights_size_limit(config)
        if path.stat().st_size > limit:   # checked before hashing: hashing a huge file takes minutes
            raise BundleFileError(f"router weights file {path} holds {path.stat().st_size:,} bytes, more than the "
                                  f"{limit:,} its manifest's routers can take: not this bundle's weights")
        expected_hash = manifest.get("weights_sha256")
        if not isinstance(expected_hash, str) or not re.fullmatch(r"[0-9a-f]{64}", expected_hash):
            raise BundleFileError(f"{directory / MANIFEST_NAME}: weights_sha256 must be the SHA-256 of "
                                  f"{path.name} (64 hex digits), got {expected_hash!r}")
        if _sha256(path) != expected_hash:
            raise BundleFileError(f"router weights file {path} is truncated or corrupt "
                                  "(its SHA-256 differs from the manifest's)")
        try:
            tensors = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as err:
            raise BundleFileError(f"router weights file {path} cannot be read ({err})") from None
        hidden = config.fingerprint["hidden_size"]
        routers = {}
        for block in config.block_indices:
            n_selected = len(config.neurons[block])
            expected = {"w1.weight": (config.d_r, hidden), "w1.bias": (config.d_r,),
                        "w2.weight": (n_selected, config.d_r), "w2.bias": (n_selected,)}
            if config.input_norm == "rms_learned":
                expected["norm_scale"] = (hidden,)
            state = {}
            for name, shape in expected.items():
                key = f"block_{block}.{name}"
                if key not in tensors:
                    raise WeightShapeError(f"{path}: tensor {key} is missing")
                if tuple(tensors[key].shape) != shape:
                    raise WeightShapeError(f"{path}: tensor {key} has shape {tuple(tensors[key].shape)}, "
                                           f"the manifest implies {shape}")
                # load_state_dict would cast silently: int64 or bool weights are not routers, and fp16 ones
                # would be evaluated in another precision than they were saved in
                if tensors[key].dtype != WEIGHTS_DTYPE:
                    raise WeightShapeError(f"{path}: tensor {key} is {str(tensors[key].dtype).removeprefix('torch.')}"
                                           f", a bundle's weights are {str(WEIGHTS_DTYPE).removeprefix('torch.')}")
                if not torch.isfinite(tensors[key]).all():
                    raise WeightShapeError(f"{path}: tensor {key} holds NaN or infinite values")
                state[name] = tensors[key]
            router = Router(hidden, n_selected, config.d_r, input_norm=config.input_norm)
            router.load_state_dict(state)
            routers[block] = router
        names = ("w1.weight", "w1.bias", "w2.weight", "w2.bias")
        names += ("norm_scale",) if config.input_norm == "rms_learned" else ()
        expected_keys = {f"block_{b}.{n}" for b in config.block_indices for n in names}
        extra = sorted(set(tensors) - expected_keys)
        if extra:
            raise WeightShapeError(f"{path}: unexpected tensors {', '.join(extra[:5])} "
                                   "not described by the manifest")
        bundle = cls(config, routers).eval()
        if model is not None:
            bundle.check_compatible(model)
        return bundle


#: The dtype `save_pretrained` writes every router tensor in; loading takes no other.
WEIGHTS_DTYPE = torch.float32
#: Room for the safetensors header (JSON: names, shapes, offsets) beyond the tensors' bytes.
_HEADER_ROOM = 1 << 20
#: The most a manifest may hold (the largest real ones, with every neuron index of a wide model, are a few MB).
MANIFEST_SIZE_LIMIT = 64 << 20


def _weights_size_limit(config: BundleConfig) -> int:
    hidden = config.fingerprint["hidden_size"]
    per_block = [config.d_r * hidden + config.d_r + len(config.neurons[b]) * (config.d_r + 1) + hidden
                 for b in config.block_indices]
    return sum(per_block) * WEIGHTS_DTYPE.itemsize + _HEADER_ROOM


def _refuse_link(path: Path, what: str) -> None:
    """A bundle's files are read only from the bundle itself: a link may point anywhere (another user's file, a
    device, a huge file to hash)."""
    if path.is_symlink():
        raise BundleFileError(f"{what} {path} is a symbolic link: a bundle's files must be regular files inside "
                              "its directory (copy the file in)")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(directory: str | Path) -> dict:
    """The parsed `cru_bundle.json` of a bundle directory (a `BundleFileError` if absent or not JSON)."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if directory.is_file():
        raise BundleFileError(f"{directory} is a file, not a router bundle directory (a directory holding "
                              f"{MANIFEST_NAME} and {WEIGHTS_NAME})")
    if not directory.is_dir():
        raise BundleFileError(f"router bundle directory {directory} does not exist")
    _refuse_link(path, "bundle manifest")
    if not path.is_file():
        raise BundleFileError(f"{directory} is not a router bundle: {MANIFEST_NAME} is missing")
    if path.stat().st_size > MANIFEST_SIZE_LIMIT:
        raise BundleFileError(f"{path} holds {path.stat().st_size:,} bytes, more than a manifest may "
                              f"({MANIFEST_SIZE_LIMIT:,})")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BundleFileError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(manifest, dict):
        raise BundleFileError(f"{path} does not hold a JSON object")
    return manifest
