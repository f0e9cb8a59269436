"""Real SGLang 0.5.23 scheduler objects on CPU without a server: published config, RadixCache, Req."""

from __future__ import annotations

import warnings
from array import array
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np


@contextmanager
def quiet_sglang() -> Iterator[None]:
    """Silence SGLang's own warnings (on CPU it warns about GPU-only quantisation kernels) for this block only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="sglang")
        yield


with quiet_sglang():
    import torch
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    from sglang.srt.runtime_context import SpawnRanks, get_context, publish, reset_context
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs


def cpu_server_args(model_path: str = "dummy") -> ServerArgs:
    """SGLang's defaults for a CPU server of `model_path` (a placeholder needs no model files)."""
    return ServerArgs(model_path=model_path, device="cpu")


def publish_cpu_context(
    model_path: str = "dummy", *, role: str = "offline", fresh: bool = False
) -> ServerArgs:
    """Publish the runtime config namespaces SGLang's policies read (disagg, memory) for a CPU server.

    Without `fresh` an already published context is kept (once per process); `fresh` replaces it.
    """
    server_args = cpu_server_args(model_path)
    if fresh:
        reset_context()
    elif get_context().is_config_namespace_published("disagg"):
        return server_args
    publish(server_args, role=role, ranks=SpawnRanks(world_rank=0, dp_rank=None))
    return server_args


def token_ids(tokens: Sequence[int] | np.ndarray) -> array:
    """Token ids as `array('q')`, the type SGLang keeps in `Req.origin_input_ids` (such an array as it is)."""
    if isinstance(tokens, array) and tokens.typecode == "q":
        return tokens
    if isinstance(tokens, np.ndarray):
        out = array("q")
        out.frombytes(np.ascontiguousarray(tokens, dtype=np.int64).tobytes())
        return out
    return array("q", tokens)


def make_req(
    rid: str,
    tokens: Sequence[int] | np.ndarray,
    *,
    max_new_tokens: int = 16,
    ignore_eos: bool = False,
    **req_args,
) -> Req:
    """A real `Req`; `req_args` go to its constructor (e.g. `lora_id`)."""
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos)
    return Req(rid, "", token_ids(tokens), params, **req_args)


def make_allocator(num_tokens: int = 16384) -> TokenToKVPoolAllocator:
    """A CPU float16 token-to-KV allocator of `num_tokens` slots."""
    return TokenToKVPoolAllocator(num_tokens, torch.float16, "cpu", None, False)


def make_radix_cache(
    cached: Iterable[Sequence[int] | np.ndarray] = (),
    *,
    allocator: TokenToKVPoolAllocator | None = None,
    req_to_token_pool=None,
    page_size: int = 1,
) -> RadixCache:
    """A real RadixCache on CPU (pools only where the caller needs them) holding the `cached` sequences."""
    cache = RadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=allocator,
            page_size=page_size,
        )
    )
    for tokens in cached:
        cache_prompt(cache, tokens)
    return cache


def cache_prompt(
    cache: RadixCache, tokens: Sequence[int] | np.ndarray, value: torch.Tensor | None = None
) -> None:
    """What prefill leaves behind: the tokens' KV in the radix tree (`value` defaults to stand-in indices)."""
    ids = token_ids(tokens)
    cache.insert(InsertParams(key=RadixKey(ids), value=torch.arange(len(ids)) if value is None else value))
