"""Moved to `cru_harness.baselines.purge` (PURGE is a method plugin); this name stays importable."""
from ..baselines.purge import *  # noqa: F401,F403
from ..baselines.purge import (KNOWN_TARGET_FOLDERS, NO_MODEL, PURGE_AUTHOR, PURGE_PREFIX,  # noqa: F401
                               PURGE_TARGETS, PurgeResolution, model_dir, purge_candidates, resolve_purge_checkpoint,
                               target_folder)
