"""CRU -- Causal Routing for Unlearning: localization (phase 1), routers and their training (phase 2), router
bundles (the shippable artifact) and attaching them to a frozen base model."""
from ..lazy import lazy_exports

# Exported lazily (PEP 562): `cru_harness.cru.plugin` and `training.blocks`, which the method registry and
# `cru-harness methods` import, must not pull in peft and transformers through this package's __init__.
_EXPORTS = {
    "RoutedModel": ".attach",
    "RoutingHandle": ".attach",
    "attach_bundles": ".attach",
    "routed": ".attach",
    "DecoderBlocksNotFoundError": "..training.blocks",
    "find_decoder_blocks": "..training.blocks",
    "BundleConfig": ".bundle",
    "BundleError": ".bundle",
    "BundleFileError": ".bundle",
    "FingerprintMismatchError": ".bundle",
    "HiddenSizeMismatchError": ".bundle",
    "IncompatibleBaseError": ".bundle",
    "LayerCountMismatchError": ".bundle",
    "RouterBundle": ".bundle",
    "UnsupportedFormatError": ".bundle",
    "WeightShapeError": ".bundle",
    "BaseWeightsWarning": ".bundle",
    "base_fingerprint": ".bundle",
    "BlockComparison": ".localize",
    "Localization": ".localize",
    "compare_localizations": ".localize",
    "PrefixCacheError": ".prefix",
    "LOSS_SHAPES": ".losses",
    "collapsed_gate": ".losses",
    "INPUT_NORMS": ".router",
    "Router": ".router",
    "GATE_SITES": "..training.sites",
    "GateSiteError": "..training.sites",
    "GateRecorder": ".train",
    "RouterTrainer": ".train",
    "RouterTrainingConfig": ".train",
    "StepResult": ".train",
    "cru_loss": ".train",
    "measure_gate_means": ".train",
    "router_schedule": ".train",
    "schedule_for": ".train",
    "train_routers": ".train",
}


__getattr__ = lazy_exports(__name__, globals(), _EXPORTS, submodules=True)   # a submodule too


__all__ = [
    "GATE_SITES", "INPUT_NORMS", "LOSS_SHAPES", "GateSiteError", "BaseWeightsWarning", "BlockComparison",
    "BundleConfig", "BundleError", "BundleFileError", "DecoderBlocksNotFoundError",
    "FingerprintMismatchError", "GateRecorder", "HiddenSizeMismatchError", "IncompatibleBaseError",
    "LayerCountMismatchError", "Localization", "PrefixCacheError", "RoutedModel", "Router", "RouterBundle",
    "RouterTrainer", "RouterTrainingConfig", "RoutingHandle", "StepResult", "UnsupportedFormatError",
    "WeightShapeError", "attach_bundles", "base_fingerprint", "collapsed_gate", "compare_localizations", "cru_loss",
    "find_decoder_blocks", "localize", "measure_gate_means", "routed", "router_schedule", "schedule_for",
    "train_routers",
]

# `localize` names both a submodule and its main function: the import system binds the submodule to this package
# whenever anything imports `cru_harness.cru.localize` first, so the function is bound here, not lazily.
from .localize import localize  # noqa: E402
