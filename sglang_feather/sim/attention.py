"""Decode attention kernels the simulator models: how many shared KV tokens a step reads, and from where."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from sglang_feather.sim.cost import BatchNodes, CostModel, KVSplit

# How it works.
#
# A decode step reads every running request's KV once per layer; what differs between kernels is how often a
# prefix that several requests share is read. The engine hands a kernel the batch's shared prefix nodes (per
# request in batch order, as (node key, tokens)) and adds each request's private KV itself, always from DRAM.
# - plain: request by request (SGLang's and today's vLLM's decode): a shared node is read once per request,
#   from L2 where the cost model's reuse window says so (`CostModel.shared_split`), else from DRAM. Decode
#   kernels stream L2-resident KV far below L2 bandwidth, so an L2-served read runs at the kernel's share of
#   it: `plain` is FlashInfer-like (SGLang's default decode backend), `plain-fa2` FlashAttention-2-like
#   (vLLM's default on A100 and Ada);
# - cascade: vLLM 0.7-0.17's automatic cascade attention (vLLM PR #11635): when every running request shares
#   at least 256 prefix tokens and there are at least 8 of them, the prefix they all share is read once for
#   the whole batch and the rest request by request; one request outside the group turns it off;
# - grouped: every distinct shared node read once per step (FlashInfer's multi-level cascade, this project's
#   `feather_grouped` SGLang backend), so a step's cost grows with the distinct prefixes in it.


class AttentionKernel(Protocol):
    @property
    def name(self) -> str: ...

    def shared_split(self, cost: CostModel, batch: BatchNodes) -> KVSplit:
        """KV tokens per layer the step reads for the batch's shared nodes, by where they come from."""
        ...


FLASHINFER_STREAMING = 0.6
"""Share of L2 bandwidth FlashInfer's decode reaches on L2-resident KV: ~3.0 TB/s of logical KV (TPOT
60.6 ms) against the AD102 L2's ~5.2 TB/s, Llama-3.1-8B, 10K-token shared prefix, batch 100, RTX 6000 Ada
(github.com/sethigeet/gpu-mem-bandwidth-experiments, attention kernel comparison). Measured on Ada only;
FlashAttention-3 (SGLang's and vLLM's Hopper default) has no published figure and is modelled alike."""
FA2_STREAMING = 0.3
"""The same for FlashAttention-2 (vLLM's decode on A100 and Ada): 1.3-2.0 TB/s (TPOT 118.6 ms) of ~5.2."""


@dataclass(frozen=True)
class PlainAttention:
    name: str
    l2_streaming: float
    """Share of L2 bandwidth the kernel reaches on L2-served reads."""

    def shared_split(self, cost: CostModel, batch: BatchNodes) -> KVSplit:
        return replace(cost.shared_split(batch), l2_streaming=self.l2_streaming)


@dataclass(frozen=True)
class AllOrNothingCascade:
    name: str = "cascade"
    min_shared_tokens: int = 256
    """vLLM's `use_cascade_attention`: no cascade below 256 common prefix tokens (PR #11635) ..."""
    min_requests: int = 8
    """... or with fewer than 8 requests running."""
    rest: PlainAttention = PlainAttention("plain-fa2", FA2_STREAMING)
    """What reads everything else: vLLM's FlashAttention-2 decode."""

    def shared_split(self, cost: CostModel, batch: BatchNodes) -> KVSplit:
        num_common = common_prefix_nodes(batch)
        common_tokens = sum(n for _, n in batch[0][:num_common]) if num_common else 0
        if len(batch) < self.min_requests or common_tokens < self.min_shared_tokens:
            return self.rest.shared_split(cost, batch)
        rest = self.rest.shared_split(cost, [nodes[num_common:] for nodes in batch])
        return rest.plus_dram(common_tokens)


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
    kernel.name: kernel
    for kernel in (
        PlainAttention("plain", FLASHINFER_STREAMING),
        PlainAttention("plain-fa2", FA2_STREAMING),
        AllOrNothingCascade(),
        GroupedAttention(),
    )
}
"""`--attention` name -> kernel. SGLang 0.5.23's decode (FlashInfer on A100 and Ada, FlashAttention-3 on Hopper)
is `plain`; vLLM 0.18-0.34 is `plain-fa2` on A100 and Ada (FlashAttention-2) and `plain` on Hopper
(FlashAttention-3); vLLM 0.7-0.17 is `cascade`; `feather_grouped` and FlashInfer's multi-level cascade are
`grouped`."""
