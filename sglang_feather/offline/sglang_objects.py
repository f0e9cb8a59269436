"""Real SGLang 0.5.23 scheduler objects on CPU without a server: published config, tree cache, Req."""

from __future__ import annotations

import warnings
from array import array
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import numpy as np


@contextmanager
def quiet_sglang() -> Iterator[None]:
    """Silence SGLang's own warnings (on CPU it warns about GPU-only quantisation kernels) for this block only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="sglang")
        yield


with quiet_sglang():
    import torch
    from sglang.srt.arg_groups.fields.schedule import Schedule
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
    from sglang.srt.mem_cache.rust_tree_core.adapter import RustUnifiedTreeCore
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.runtime_context import SpawnRanks, get_context, get_memory, publish, reset_context
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs


UNIFIED = "unified"
PYTHON = "python"
CACHE_KINDS = (UNIFIED, PYTHON)
"""`make_radix_cache` kinds: what a server builds, and SGLang's older Python `RadixCache` (comparison only)."""
DEFAULT_KV_TOKENS = 16384

TreeCache = UnifiedRadixCache | RadixCache
"""What `make_radix_cache` builds: a server's tree cache, or SGLang's older Python one."""

if TYPE_CHECKING:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.memory_pool import KVCache

# Objects SGLang's constructors declare and the CPU harness has none of: no KV storage (the allocator only
# keeps its pool; slots are handed out, never written) and no model (the unified tree cache reads no config).
NO_KV_STORAGE = cast("KVCache", None)
NO_MODEL_CONFIG = cast("ModelConfig", None)


def cpu_server_args(model_path: str = "dummy") -> ServerArgs:
    """SGLang's defaults for a CPU server of `model_path` (a placeholder needs no model files)."""
    # ServerArgs gathers its fields from SGLang's option namespaces when it is imported (msgspec.defstruct), so a
    # type checker sees a class without them: the keywords go in as a mapping.
    fields: dict[str, Any] = {"model_path": model_path, "device": "cpu"}
    return ServerArgs(**fields)


def default_max_prefill_tokens() -> int:
    """SGLang's default `--max-prefill-tokens`: the new (uncached) tokens one prefill pass may take (its
    `Schedule` options, which `ServerArgs` gathers)."""
    return Schedule().max_prefill_tokens


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


def make_allocator(num_tokens: int = DEFAULT_KV_TOKENS) -> TokenToKVPoolAllocator:
    """A CPU float16 token-to-KV allocator of `num_tokens` slots."""
    return TokenToKVPoolAllocator(num_tokens, torch.float16, "cpu", NO_KV_STORAGE, False)


def make_radix_cache(
    cached: Iterable[Sequence[int] | np.ndarray] = (),
    *,
    kind: str = UNIFIED,
    allocator: TokenToKVPoolAllocator | None = None,
    req_to_token_pool=None,
    page_size: int = 1,
    num_kv_tokens: int | None = None,
    kv_events: bool = False,
) -> TreeCache:
    """The tree cache a CPU server builds (`kind="python"`: SGLang's older Python `RadixCache`), holding `cached`.

    Without an `allocator` one of `num_kv_tokens` slots is made (default: room for `cached` and
    `DEFAULT_KV_TOKENS` more); every cached token takes a slot, as on a server. Pools the caller does not
    need stay None. `kv_events` turns on the cache's KV-event recorder (what `--schedule-policy feather` does).
    """
    cached = tuple(cached)
    if allocator is None:
        allocator = make_allocator(num_kv_tokens or sum(map(len, cached)) + DEFAULT_KV_TOKENS)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        enable_kv_cache_events=kv_events,
    )
    cache = _build_cache(kind, params)
    for tokens in cached:
        cache_prompt(cache, tokens)
    return cache


def _build_cache(kind: str, params: CacheInitParams) -> TreeCache:
    if kind == PYTHON:
        return RadixCache(params)
    if kind != UNIFIED:
        raise ValueError(f"unknown tree cache kind {kind!r}; choose from {CACHE_KINDS}")
    return server_tree_cache(params)


def server_tree_cache(params: CacheInitParams) -> UnifiedRadixCache:
    """SGLang's own factory (`create_tree_cache`), as a CPU server's KV-cache builder calls it.

    Fails unless it returns a `UnifiedRadixCache` on SGLang's Rust radix tree (what a server runs; the env var
    SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND selects its radix tree, default "rust").
    """
    server_args = publish_cpu_context()
    params.eviction_policy = get_memory().radix_eviction_policy
    with quiet_sglang():
        cache = create_tree_cache(
            TreeCacheBuildContext(
                server_args=server_args,
                params=params,
                is_hybrid_swa=False,
                is_hybrid_ssm=False,
                enable_hierarchical_cache=False,
                disable_radix_cache=False,
                tp_worker=None,
                model_config=NO_MODEL_CONFIG,
                tp_size=1,
                tp_rank=0,
                tp_group=None,
            )
        )
    if not isinstance(cache, UnifiedRadixCache) or not isinstance(cache.tree_core, RustUnifiedTreeCore):
        raise RuntimeError(
            f"SGLang built {describe_tree_cache(cache)}, not UnifiedRadixCache (RustUnifiedTreeCore) as a "
            "server does; check SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND and SGLang's Rust radix tree extension"
        )
    return cache


def describe_tree_cache(cache: BasePrefixCache) -> str:
    """The cache class and, for a unified cache, its radix tree (`tree_core`): "UnifiedRadixCache (RustUnifiedTreeCore)"."""
    tree_core = getattr(cache, "tree_core", None)
    name = type(cache).__name__
    return name if tree_core is None else f"{name} ({type(tree_core).__name__})"


def cache_prompt(
    cache: TreeCache, tokens: Sequence[int] | np.ndarray, value: torch.Tensor | None = None
) -> None:
    """What prefill leaves behind: the tokens' KV in the tree.

    Without `value`, as a server does: the cached prefix keeps its slots and the rest gets new ones from
    the cache's allocator.
    """
    ids = token_ids(tokens)
    key = RadixKey(ids)
    if value is not None:
        cache.insert(InsertParams(key=key, value=value))
        return
    match = cache.match_prefix(MatchPrefixParams(key=key))
    num_cached = match.device_prefix_len
    new_slots = cache.token_to_kv_pool_allocator.alloc(len(ids) - num_cached)
    if new_slots is None:
        raise RuntimeError(f"the KV allocator has no room for {len(ids) - num_cached} more tokens")
    prefix_slots = cache.path_device_indices(match.last_device_node)[:num_cached]
    cache.insert(
        InsertParams(key=key, value=torch.cat([prefix_slots, new_slots]), prev_prefix_len=num_cached)
    )
