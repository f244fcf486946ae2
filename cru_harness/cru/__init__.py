"""CRU -- Causal Routing for Unlearning: localization (phase 1), routers and their training (phase 2), router
bundles (the shippable artifact) and attaching them to a frozen base model."""
from .attach import RoutedModel, RoutingHandle, attach_bundles, routed
from .blocks import DecoderBlocksNotFoundError, find_decoder_blocks
from .bundle import (
    BundleConfig,
    BundleError,
    BundleFileError,
    FingerprintMismatchError,
    HiddenSizeMismatchError,
    IncompatibleBaseError,
    LayerCountMismatchError,
    RouterBundle,
    UnsupportedFormatError,
    WeightShapeError,
    base_fingerprint,
)
from .localize import BlockComparison, Localization, compare_localizations, localize
from .router import Router
from .train import RouterTrainingConfig, measure_gate_means, train_routers

__all__ = [
    "BlockComparison", "BundleConfig", "BundleError", "BundleFileError", "DecoderBlocksNotFoundError",
    "FingerprintMismatchError", "HiddenSizeMismatchError", "IncompatibleBaseError", "LayerCountMismatchError",
    "Localization", "RoutedModel", "Router", "RouterBundle", "RouterTrainingConfig", "RoutingHandle",
    "UnsupportedFormatError", "WeightShapeError", "attach_bundles", "base_fingerprint", "compare_localizations",
    "find_decoder_blocks", "localize", "measure_gate_means", "routed", "train_routers",
]
