"""vLLM's request ids: strings, which the admission hands back as any hashable id."""

from __future__ import annotations

from sglang_feather.types import RequestId


def vllm_request_id(request_id: RequestId) -> str:
    """A request id the scheduler gave the admission, as vLLM's own (`Request.request_id`, a string)."""
    if not isinstance(request_id, str):
        raise TypeError(f"vLLM request ids are strings, got {request_id!r}")
    return request_id
