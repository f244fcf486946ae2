"""CRU -- Causal Routing for Unlearning: localization (phase 1), routers and their training (phase 2), router
bundles (the shippable artifact) and attaching them to a frozen base model."""
from .attach import RoutedModel, RoutingHandle, attach_bundles, routed
from ..training.blocks import DecoderBlocksNotFoundError, find_decoder_blocks
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
    BaseWeightsWarning,
    base_fingerprint,
)
from .localize import BlockComparison, Localization, compare_localizations, localize
from .prefix import PrefixCacheError
from .losses import LOSS_SHAPES, collapsed_gate
from .router import INPUT_NORMS, Router
from ..training.sites import GATE_SITES, GateSiteError
from .train import (GateRecorder, RouterTrainer, RouterTrainingConfig, StepResult, cru_loss, measure_gate_means,
                    router_schedule, schedule_for, train_routers)

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
