"""The `cru` model's router bundles: `routers=` read and checked before the base loads, attached to the loaded
model, lifted for a while (`without`), and the one-line warning when a bundle trained on another prompt format."""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from cru_harness.protocol import ROUTER_SEPARATOR

from .arguments import ModelArgumentError

eval_logger = logging.getLogger(__name__)


def parse_router_spec(routers) -> list:
    """`routers=` as given (None, `"a+b"`, a path, a RouterBundle, or a list of those) -> a list of entries."""
    if routers is None or routers == "" or routers is False:   # CRULM refuses "" and False (check_empty_arguments)
        return []
    if isinstance(routers, (str, Path)):
        entries = [part.strip() for part in str(routers).split(ROUTER_SEPARATOR)]
        if any(not part for part in entries):
            raise ModelArgumentError(
                f"routers={routers!r}: empty bundle directory between '{ROUTER_SEPARATOR}' separators; "
                f"write routers=<dir>[{ROUTER_SEPARATOR}<dir>...]"
            )
        return entries
    if isinstance(routers, (list, tuple)):
        out = []
        for item in routers:
            out.extend([item] if not isinstance(item, (str, Path)) else [str(item)])
        return out
    return [routers]  # a single RouterBundle object


def _load_bundle(entry):
    from cru_harness.cru.bundle import RouterBundle

    if isinstance(entry, RouterBundle):
        return entry
    # A missing or malformed directory raises the bundle's own BundleFileError naming the path.
    return RouterBundle.from_pretrained(Path(entry).expanduser())


class Routers:
    """The bundles of `routers=`, read and validated at once (a bad one fails in a second, not after the base
    loads), then attached to the model (`attach`), each on the device of the block it reads."""

    def __init__(self, spec) -> None:
        entries = parse_router_spec(spec)
        self.bundles: list = [_load_bundle(e) for e in entries]
        self.sources: list[str] = [str(e) if isinstance(e, (str, Path)) else repr(e) for e in entries]
        self._model = None
        self._handle = None
        self._format_checked = False

    def attach(self, model) -> None:
        """Attach the bundles to `model` (none: nothing). `attach_bundles` checks each bundle against the model
        first: a mismatch raises the bundle's own IncompatibleBaseError before any hook is installed."""
        self._model = model
        if self.bundles:
            from cru_harness.cru.attach import attach_bundles

            self._handle = attach_bundles(model, self.bundles)

    @property
    def attached(self) -> bool:
        return self._handle is not None

    @contextlib.contextmanager
    def without(self):
        """The base model alone for a while (e.g. the NLL of answers under the original model)."""
        if self._handle is None:
            yield
            return
        self._handle.remove()
        self._handle = None
        try:
            yield
        finally:
            self.attach(self._model)

    def check_prompt_format(self, chat_rendered: bool) -> None:
        """Warn once, in one line, when a bundle's routers trained on another prompt format than this evaluation's
        (the chat template or not): routers gate text they never saw, so "forgetting" can be a format effect. A
        bundle that does not record its format (made before bundles recorded it) is not checked."""
        if self._format_checked or not self.bundles:
            return
        self._format_checked = True
        evaluated = "the chat template" if chat_rendered else "no chat template"
        for source, bundle in zip(self.sources, self.bundles):
            trained = (bundle.config.training or {}).get("prompt_format")
            if trained is not None and (trained == "chat") != chat_rendered:
                eval_logger.warning(
                    f"router bundle {source} trained on {'chat-template' if trained == 'chat' else trained} prompts, "
                    f"but this evaluation prompts with {evaluated}: its scores measure a format change too "
                    f"(train and evaluate alike: unlearn --prompt-format, lm_eval --apply_chat_template)")
                return
