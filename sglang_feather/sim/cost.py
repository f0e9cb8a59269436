"""Physics cost model of one GPU: prefill from FLOPs, decode from weight and KV bytes through HBM and L2."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from sglang_feather.sim.profile import Profile

# How it works.
#
# A decode step reads all weights once (or is compute bound, whichever is slower) and, per layer, every
# request's KV. Decode attention runs one thread block per (request, KV head) in batch order, so about
# `num_sms * ctas_per_sm / num_kv_heads` consecutive requests run concurrently. A request's shared prefix
# node is served from L2 when a request among the previous concurrent ones read the same node and the
# distinct shared KV of that window fits in the usable L2; otherwise it comes from DRAM again. Private KV
# (unique prompt tails and generated tokens) always comes from DRAM. Order inside the batch therefore
# matters: the same requests grouped contiguously hit L2 where interleaved ones miss. The attention's time is
# the DRAM-served bytes at the measured DRAM rate or all of its bytes at the kernel's share of the measured L2
# bandwidth (`KVSplit.l2_streaming`: decode kernels stream L2-resident KV far below it), whichever is slower.

BatchNodes = Sequence[Sequence[tuple[Hashable, int]]]
"""Per request in batch order: its shared prefix nodes as (node key, tokens)."""


@dataclass(frozen=True)
class KVSplit:
    """KV tokens per layer of one decode step by where they are read from (summed over the batch)."""

    dram_tokens: int
    l2_tokens: int
    l2_streaming: float = 1.0
    """Share of the L2 bandwidth the attention kernel reaches on the L2-served reads: decode kernels stream
    L2-resident KV far below it (the kernel's factor, `attention.py`); 1.0 is the whole bandwidth."""

    def plus_dram(self, num_tokens: int) -> KVSplit:
        """The same split with `num_tokens` more read from DRAM (the batch's private KV)."""
        return replace(self, dram_tokens=self.dram_tokens + num_tokens)


class CostModel(Protocol):
    @property
    def name(self) -> str: ...

    def prefill_s(self, num_new: Sequence[int], num_cached: Sequence[int]) -> float: ...

    def shared_split(self, batch: BatchNodes) -> KVSplit: ...

    def decode_s(self, batch_size: int, kv: KVSplit) -> float: ...

    def kv_capacity_tokens(self, mem_fraction_static: float) -> int: ...


@dataclass(frozen=True)
class PhysicsCostModel:
    profile: Profile

    @property
    def name(self) -> str:
        return f"{self.profile.gpu} x {self.profile.model}"

    def _m(self, key: str) -> float:
        return self.profile.value(f"model.architecture.{key}")

    def _g(self, key: str) -> float:
        return self.profile.value(f"gpu.{key}")

    @property
    def kv_bytes_per_token_layer(self) -> float:
        return 2 * self._m("num_kv_heads") * self._m("head_dim") * self._m("dtype_bytes")

    @property
    def weight_bytes(self) -> float:
        return self._m("num_params") * self._m("dtype_bytes")

    @property
    def concurrent_requests(self) -> int:
        ctas = self._g("compute.num_sms") * self._g("decode_attention.ctas_per_sm")
        return max(1, int(ctas // self._m("num_kv_heads")))

    @property
    def l2_usable_tokens(self) -> float:
        usable = self._g("decode_attention.l2_bytes") * self._g("decode_attention.l2_effective_fraction")
        return usable / self.kv_bytes_per_token_layer

    def _hbm(self) -> float:
        return self._g("memory.hbm_bandwidth") * self._g("memory.hbm_efficiency")

    def _flops(self) -> float:
        return self._g("compute.bf16_tflops") * self._g("compute.prefill_efficiency")

    def kv_capacity_tokens(self, mem_fraction_static: float) -> int:
        room = self._g("memory.hbm_bytes") * mem_fraction_static - self.weight_bytes
        if room <= 0:
            raise ValueError(f"{self.name}: weights do not fit in {mem_fraction_static:.2f} of GPU memory")
        return int(room // (self.kv_bytes_per_token_layer * self._m("num_layers")))

    def prefill_s(self, num_new: Sequence[int], num_cached: Sequence[int]) -> float:
        new = sum(num_new)
        if new == 0:
            return 0.0
        attn = sum(n * c + n * n / 2 for n, c in zip(num_new, num_cached, strict=True))
        width = self._m("num_heads") * self._m("head_dim")
        flops = 2 * self._m("num_params") * new + 4 * self._m("num_layers") * width * attn
        compute = max(flops / self._flops(), self.weight_bytes / self._hbm())
        return compute + self._g("overhead.step_s") + self._g("overhead.per_request_s") * len(num_new)

    def shared_split(self, batch: BatchNodes) -> KVSplit:
        window = self.concurrent_requests
        reuse = self.profile.get("gpu.decode_attention.reuse_window_tokens")
        budget = self.l2_usable_tokens
        in_window: Counter = Counter()
        window_tokens: float = 0  # tokens of the window's nodes, each capped at `reuse` (a profile number)
        dram = l2 = 0
        for i, nodes in enumerate(batch):
            if i >= window:
                for key, n in batch[i - window]:
                    in_window[key] -= 1
                    if in_window[key] == 0:
                        del in_window[key]
                        window_tokens -= n if reuse is None else min(n, reuse)
            for key, n in nodes:
                if key not in in_window:
                    window_tokens += n if reuse is None else min(n, reuse)
            for key, n in nodes:
                if in_window[key] > 0 and window_tokens <= budget:
                    l2 += n
                else:
                    dram += n
                in_window[key] += 1
        return KVSplit(dram, l2)

    def linear_s(self, batch_size: int) -> float:
        """A decode step's non-attention time: every weight read once, or the products if compute bound."""
        return max(self.weight_bytes / self._hbm(), 2 * self._m("num_params") * batch_size / self._flops())

    def attention_s(self, kv: KVSplit) -> float:
        """A decode step's attention reads over every layer: the DRAM-served bytes at the DRAM rate or every
        byte at the kernel's share of L2 bandwidth, whichever is slower (the kernel streams at most that
        fast from anywhere, and an L2 hit never costs more than a DRAM read)."""
        per_token = self.kv_bytes_per_token_layer * self._m("num_layers")
        stream_rate = kv.l2_streaming * self._g("decode_attention.l2_bandwidth")
        dram_s = kv.dram_tokens * per_token / self._hbm()
        return max(dram_s, (kv.dram_tokens + kv.l2_tokens) * per_token / stream_rate)

    def decode_s(self, batch_size: int, kv: KVSplit) -> float:
        if batch_size == 0:
            return 0.0
        overhead = self._g("overhead.step_s") + self._g("overhead.per_request_s") * batch_size
        return self.linear_s(batch_size) + self.attention_s(kv) + overhead
