"""What SGLang's scheduler holds after a step: its waiting requests and every request holding a batch slot."""

from __future__ import annotations

from typing import Any


def full_picture(scheduler: Any, plan: Any) -> tuple[list[Any], list[Any]]:
    """SGLang's waiting requests and every request holding a batch slot after `get_next_batch_to_run`: the
    running batch, the batch about to run, the decode requests folded into a mixed batch, the chunked one, and
    the requests of a launched batch whose result the overlap loop has not processed yet.

    The last group matters: the overlap loop runs `get_next_batch_to_run` before it processes the previous
    batch's result, and with `enable_skip_finishing_decode` SGLang already drops from the running batch the
    requests that result will finish by length (`Scheduler._reqs_finishing_inflight`). Until the result is
    processed (and `release_kv_cache` reports them) they are in no queue but still live. A launched request
    that waits again or was released by retraction (`is_retracted`) is not in flight."""
    waiting = list(scheduler.waiting_queue)
    running, batch = plan.running_batch, plan.batch_to_run
    active = list(running.reqs) if running is not None else []
    if batch is not None:
        if batch is not running:
            active.extend(batch.reqs)
        decoding = getattr(batch, "decoding_reqs", None)
        if decoding and not batch.forward_mode.is_decode():
            active.extend(decoding)
    chunked = getattr(scheduler, "chunked_req", None)
    if chunked is not None:
        active.append(chunked)
    waiting_ids = {req.rid for req in waiting}
    for launched, _result in getattr(scheduler, "result_queue", ()):
        active.extend(
            req
            for req in launched.reqs
            if not req.finished() and not req.is_retracted and req.rid not in waiting_ids
        )
    return waiting, active
