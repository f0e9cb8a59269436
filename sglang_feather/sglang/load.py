"""Feather's part of SGLang's load report: each waiting request's matched prefix, from the CHT, so that
`num_waiting_uncached_tokens` is counted, not estimated."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

# SGLang 0.5.23's `SchedulerLoadInquirer.get_num_waiting_uncached_tokens` (scheduler_components/
# load_inquirer.py) sums `seqlen - num_matched_prefix_tokens` over the waiting queue when the policy's
# `waiting_queue_prefix_matched(queue)` is true, and `seqlen * (1 - recent hit rate)` otherwise. SGLang's own
# fcfs matches every waiting request against the cache at each pass to keep that field fresh; Feather's pass
# matches none (its ranking comes from the CHT), so the field would hold 0 for a request never reached and the
# report would count its whole prompt as uncached. `mark_matched` fills the field from the CHT instead: the
# prefix that running requests or the cache hold (a running request's prefix is cached before a request
# sharing it is admitted: Feather defers it until then). The report is built by `get_loads` (the periodic load
# snapshot behind `/v1/loads`, read by SMG and by SGLang's `total_tokens` DP balancing).


def mark_matched(runtime: Any, waiting_queue: Sequence[Any]) -> bool:
    """Set `num_matched_prefix_tokens` of every waiting request from Feather's coverage; True when every one
    is tracked (the report is then exact to a chunk), False to let SGLang estimate."""
    try:
        runtime.drain_events()
        admission = runtime.admission
        for req in waiting_queue:
            if not admission.is_waiting(req.rid):
                return False
            # A cache never matches a whole prompt: SGLang always computes the last token.
            req.num_matched_prefix_tokens = min(admission.covered_tokens(req.rid), max(0, req.seqlen - 1))
    except Exception:
        logger.exception("Feather could not report matched prefixes; SGLang estimates the load instead")
        return False
    return True
