"""vLLM's prefix cache as Admission's cache tier, fed from the block pool's own cache and evict calls."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id, make_block_hash_with_group_id
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

from sglang_feather.admission import Admission
from sglang_feather.cht import HashChainError
from sglang_feather.vllm.hashes import chunk_hash

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_utils import BlockHash, BlockHashWithGroupId

logger = init_logger("vllm.feather")

# How it works.
#
# vLLM's block pool maps each cached block hash (with its KV-cache group) to the block or blocks holding it,
# and only three of its methods change that map: `cache_full_blocks` (a request's newly full blocks, called
# when vLLM allocates them, before they are computed), `_remove_cached_block_hashes` (every way a block
# loses its hash: LRU eviction when `get_new_blocks` reuses a free block, `evict_blocks`, a partial block's
# promotion) and `reset_prefix_cache`. The feed wraps those three on the pool object itself, so the tier
# changes in the same call as vLLM's map, with vLLM's own `BlockHash` bytes (a chunk's hash is
# `hashes.chunk_hash` of them, as in the CHT's request paths): after `cache_full_blocks` it stores the
# request's new blocks that the map now holds, as one chain below the request's block before them; after a
# removal it uncaches a hash only when no block holds it any more (vLLM does not de-duplicate: a block-aligned
# prompt recomputes its last block, so two blocks can hold one hash, and evicting one of them leaves the
# hash cached); after a reset it clears the tier. vLLM's KV events are neither needed nor touched.
#
# vLLM also looks waiting requests up only after it has allocated (so registered) this step's chunks of the
# running requests and of the requests admitted before them. Before Admission plans a step, the capacity
# estimate therefore `reserve`s those blocks in the tier, and each admitted candidate's as it fits, so a
# request sharing them is not taken for an in-flight prefix that vLLM would compute twice; after vLLM's
# `schedule()`, `settle` uncaches the reserved hashes vLLM did not register after all.


def unfed_reason(scheduler: Any) -> str | None:
    """Why the tier cannot equal vLLM's prefix match on this engine, or None when it can: one full-attention
    KV-cache group whose hash block is its KV block (hybrid models, sliding windows, decode context
    parallelism and hash blocks smaller than KV blocks match in other units)."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    if len(managers) != 1 or type(managers[0]) is not FullAttentionManager:
        return "the KV cache is not one full-attention group"
    if not scheduler.hash_block_size == scheduler.block_size == managers[0].block_size:
        return "vLLM hashes blocks of another size than its KV blocks"
    if scheduler.dcp_world_size != 1:
        return "decode context parallelism shards each block"
    return None


class CacheFeed:
    """Keeps `admission`'s cache tier equal to the prefix cache of vLLM's block `pool` (one KV-cache group)."""

    def __init__(self, admission: Admission, pool: Any, group_id: int = 0) -> None:
        self.admission = admission
        self.pool = pool
        self.group_id = group_id
        self.num_refused = 0
        """Chains the tier refused (`HashChainError`: two 8-byte chunk hashes collided); left uncached."""
        self._reserved: list[BlockHash] = []
        self._cache_full_blocks = pool.cache_full_blocks
        self._remove_cached_block_hashes = pool._remove_cached_block_hashes
        self._reset_prefix_cache = pool.reset_prefix_cache
        pool.cache_full_blocks = self.cache_full_blocks
        pool._remove_cached_block_hashes = self.remove_cached_block_hashes
        pool.reset_prefix_cache = self.reset_prefix_cache

    # ------------------------------------------------------------------ the pool's calls, wrapped

    def cache_full_blocks(
        self,
        request: Any,
        blocks: Any,
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        self._cache_full_blocks(
            request,
            blocks,
            num_cached_blocks,
            num_full_blocks,
            block_size,
            kv_cache_group_id,
            *args,
            **kwargs,
        )
        if kv_cache_group_id == self.group_id:
            self._store(request.block_hashes, num_cached_blocks, num_full_blocks)

    def remove_cached_block_hashes(self, block: Any) -> list[BlockHashWithGroupId]:
        removed = self._remove_cached_block_hashes(block)
        gone = [
            chunk_hash(get_block_hash(key))
            for key in removed
            if get_group_id(key) == self.group_id and not self._holds_key(key)
        ]
        if gone:
            self.admission.cache_removed(gone)
        return removed

    def reset_prefix_cache(self) -> bool:
        done = self._reset_prefix_cache()
        if done:
            self._reserved.clear()
            self.admission.cache_cleared()
        return done

    # ------------------------------------------------------------------ LRU

    def refresh(self, block_hashes: Sequence[BlockHash]) -> None:
        """Make the cached blocks of this prompt that no request uses the last vLLM evicts (`refresh.py`):
        vLLM reuses free blocks from the front of its queue, so they move to its end, the prompt's first block
        last, as vLLM's own free of a request orders them."""
        free = []
        for block_hash in block_hashes:
            block = self.pool.cached_block_hash_to_block.get_one_block(
                make_block_hash_with_group_id(block_hash, self.group_id)
            )
            if block is None:
                break
            if block.ref_cnt == 0:
                free.append(block)
        queue = self.pool.free_block_queue
        for block in reversed(free):
            queue.remove(block)
            queue.append(block)

    # ------------------------------------------------------------------ this step's allocations

    def reserve(self, block_hashes: Sequence[BlockHash], start: int, end: int) -> None:
        """vLLM will register `block_hashes[start:end]` before it looks the next waiting request up."""
        chain = block_hashes[start:end]
        if chain and self._store_chain(chain, block_hashes[start - 1] if start else None):
            self._reserved.extend(chain)

    def settle(self) -> None:
        """vLLM's schedule() is over: uncache the reserved blocks it did not register."""
        gone = [chunk_hash(h) for h in self._reserved if not self.holds(h)]
        self._reserved.clear()
        if gone:
            self.admission.cache_removed(gone)

    # ------------------------------------------------------------------ internals

    def holds(self, block_hash: BlockHash) -> bool:
        """Whether vLLM's prefix cache holds this block hash (in this feed's group)."""
        return self._holds_key(make_block_hash_with_group_id(block_hash, self.group_id))

    def _holds_key(self, key: BlockHashWithGroupId) -> bool:
        return self.pool.cached_block_hash_to_block.get_one_block(key) is not None

    def _store(self, block_hashes: Sequence[BlockHash], start: int, end: int) -> None:
        """The pool cached the request's blocks [start, end): the chain of those it holds, from the start."""
        chain = []
        for block_hash in block_hashes[start:end]:
            if not self.holds(block_hash):
                break
            chain.append(block_hash)
        if chain:
            self._store_chain(chain, block_hashes[start - 1] if start else None)

    def _store_chain(self, chain: Sequence[BlockHash], parent: BlockHash | None) -> bool:
        try:
            self.admission.cache_stored(
                [chunk_hash(h) for h in chain], None if parent is None else chunk_hash(parent)
            )
        except HashChainError as err:
            self.num_refused += 1
            logger.warning("FeatherScheduler: the cache tier refused %d blocks (%s)", len(chain), err)
            return False
        return True
