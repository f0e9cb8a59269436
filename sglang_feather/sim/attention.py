"""Decode attention kernels the simulator models: how many shared KV tokens a step reads, and from where."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sglang_feather.sim.cost import BatchNodes, CostModel, KVSplit

# How it works.
#
# A decode step reads every running request's KV once per layer; what differs between kernels is how often a
# prefix that several requests share is read. The engine hands a kernel the batch's shared prefix nodes (per
# request in batch order, as (node key, tokens)) and adds each request's private KV itself, always from DRAM.
# - plain: request by request (SGLang's and today's vLLM's decode): a shared node is read once per request,
#   from L2 where the cost model's reuse window says so (`CostModel.shared_split`), else from DRAM;
# - cascade: vLLM 0.7-0.17's automatic cascade attention (vLLM PR #11635): when every running request shares
#   at least 256 prefix tokens and there are at least 8 of them, the prefix they all share is read once for
#   the whole batch and the rest request by request; one request outside the group turns it off;
# - grouped: every distinct shared node read once per step (FlashInfer's multi-level cascade, this project's
#   `feather_grouped` SGLang backend), so a step's cost grows with the distinct prefixes in it.


class AttentionKernel(Protocol):
    name: str

    def shared_split(self, cost: CostModel, batch: BatchNodes) -> KVSplit:
        """KV tokens per layer the step reads for the batch's shared nodes, by where they come from."""
        ...


@dataclass(frozen=True)
class PlainAttention:
    name: str = "plain"

    def shared_split(self, cost: CostModel, batch: BatchNodes) -> KVSplit:
        return cost.shared_split(batch)


@dataclass(frozen=True)
class AllOrNothingCascade:
    name: str = "cascade"
    min_shared_tokens: int = 256
    """vLLM's `use_cascade_attention`: no cascade below 256 common prefix tokens (PR #11635) ..."""
    min_requests: int = 8
    """... or with fewer than 8 requests running."""

    def shared_split(self, cost: CostModel, batch: BatchNodes) -> KVSplit:
        num_common = common_prefix_nodes(batch)
        common_tokens = sum(n for _, n in batch[0][:num_common]) if num_common else 0
        if len(batch) < self.min_requests or common_tokens < self.min_shared_tokens:
            return cost.shared_split(batch)
        rest = cost.shared_split([nodes[num_common:] for nodes in batch])
        return KVSplit(rest.dram_tokens + common_tokens, rest.l2_tokens)


@dataclass(frozen=True)
class GroupedAttention:
    name: str = "grouped"

    def shared_split(self, cost: CostModel, batch: BatchNodes) -> KVSplit:
        return KVSplit(distinct_shared_tokens(batch), 0)


def common_prefix_nodes(batch: BatchNodes) -> int:
    """How many leading shared nodes every request of the batch has in common (0 for an empty batch)."""
    if not batch:
        return 0
    first = batch[0]
    num = len(first)
    for nodes in batch[1:]:
        num = min(num, len(nodes))
        for i in range(num):
            if nodes[i][0] != first[i][0]:
                num = i
                break
        if num == 0:
            break
    return num


def distinct_shared_tokens(batch: BatchNodes) -> int:
    """Tokens per layer of the batch's distinct shared nodes, each counted once."""
    return sum(dict(node for nodes in batch for node in nodes).values())


ATTENTION_KERNELS: dict[str, AttentionKernel] = {
    kernel.name: kernel for kernel in (PlainAttention(), AllOrNothingCascade(), GroupedAttention())
}
"""`--attention` name -> kernel. SGLang 0.5.23's decode backends (FlashInfer, FA3, Triton, torch_native) and
vLLM 0.18+ are `plain`; vLLM 0.7-0.17 is `cascade`; `feather_grouped` and FlashInfer's multi-level cascade are
`grouped`."""
