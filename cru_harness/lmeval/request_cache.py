"""`--cache_requests` and the project's tasks.

lm-eval keys its request cache by task name, shot count, chat flag, system prompt and tokenizer. The project's
tasks build their requests from more than that: the metadata (`tofu_preset`, `tofu_model_family`, `rwku_targets`,
`rwku_preset`, `data_dir`, ...) and `--gen_kwargs`. A cached request list would come back built under another
setting (RWKU: one target's prompts paired with another's references) while the results record the new one. The
tasks therefore build their requests every time, which is cheap, and say so once.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class UncachedRequests:
    """Mixin for a `ConfigurableTask` (listed before it): `build_all_requests` ignores `cache_requests` and
    `rewrite_requests_cache`, with a warning, so nothing is read from or written to lm-eval's request cache."""

    _warned_request_cache = False

    def build_all_requests(self, *, cache_requests: bool = False, rewrite_requests_cache: bool = False, **kwargs):
        if (cache_requests or rewrite_requests_cache) and not UncachedRequests._warned_request_cache:
            UncachedRequests._warned_request_cache = True
            log.warning("--cache_requests is ignored for the cru-harness tasks: lm-eval keys the request cache by "
                        "task name alone, and these tasks' requests depend on --metadata and --gen_kwargs; "
                        "they are built afresh (cheap)")
        return super().build_all_requests(cache_requests=False, rewrite_requests_cache=False, **kwargs)
