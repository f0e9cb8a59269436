"""Hypothesis state machine: decode batches as SGLang's radix cache and allocator shape them over time
(prefix sharing, chunked prefill, decode steps, retraction and finishing with stale rows and reused slots),
the grouped segments checked against the pairwise reference and the kernel against torch_native each step."""

from __future__ import annotations

import random

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey

from sglang_feather.offline.sglang_objects import make_allocator, make_radix_cache, token_ids
from sglang_feather.sglang.grouped_attention.kernel import DecodePlan, grouped_decode
from sglang_feather.sglang.grouped_attention.segments import check_segments, find_segments
from tests.sglang.grouped_batches import Batch, torch_native_decode

NUM_SLOTS = 8192
NUM_ROWS = 24
MAX_LEN = 1024
HEADS = (4, 2, 16)  # q heads, KV heads, head dim


class DecodeBatches(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rng = random.Random(0)
        self.allocator = make_allocator(NUM_SLOTS)
        self.cache = make_radix_cache(allocator=self.allocator)
        self.rows = ReqToTokenPool(NUM_ROWS, MAX_LEN, "cpu", False)
        self.kv = MHATokenToKVPool(NUM_SLOTS + 1, 1, torch.float32, HEADS[1], HEADS[2], 1, "cpu", False)
        for buffer in (self.kv.get_key_buffer(0), self.kv.get_value_buffer(0)):
            buffer.copy_(torch.randn(buffer.shape, generator=torch.Generator().manual_seed(2)))
        self.systems = [[self.rng.randrange(1, 900) for _ in range(n)] for n in (40, 97, 5)]
        self.docs = [[self.rng.randrange(1, 900) for _ in range(n)] for n in (30, 64, 150)]
        self.free_rows = list(range(1, NUM_ROWS))
        self.running: dict[
            int, tuple[list[int], list[int], int]
        ] = {}  # row -> (tokens, private slots, cached)

    @precondition(lambda self: self.free_rows)
    @rule(
        system=st.integers(0, 2),
        doc=st.one_of(st.none(), st.integers(0, 2)),
        question=st.integers(1, 40),
        chunk=st.one_of(st.none(), st.integers(1, 60)),
    )
    def admit(self, system, doc, question, chunk):
        tokens = self.systems[system] + (self.docs[doc] if doc is not None else [])
        tokens = tokens + [self.rng.randrange(1, 900) for _ in range(question)]
        row = self.free_rows.pop(self.rng.randrange(len(self.free_rows)))
        # Chunked prefill: the first chunk lands in the tree before the rest is computed.
        cut = len(tokens) if chunk is None else min(len(tokens), chunk)
        self._prefill(row, tokens[:cut], 0)
        if cut < len(tokens):
            self._prefill(row, tokens, cut)
        self.running[row] = (tokens, [], len(tokens))

    def _prefill(self, row: int, tokens: list[int], done: int) -> None:
        key = RadixKey(token_ids(tokens))
        match = self.cache.match_prefix(MatchPrefixParams(key=key))
        cached = match.device_prefix_len
        assert cached >= done, "the pool is large enough that nothing is evicted"
        prefix = self.cache.path_device_indices(match.last_device_node)[:cached].to(torch.int64)
        new = self.allocator.alloc(len(tokens) - cached)
        slots = torch.cat([prefix, new.to(torch.int64)])
        self.rows.req_to_token[row, : len(tokens)] = slots.to(torch.int32)
        self.cache.insert(InsertParams(key=key, value=slots, prev_prefix_len=match.device_prefix_len))

    @precondition(lambda self: self.running)
    @rule(steps=st.integers(1, 3))
    def decode(self, steps):
        for _ in range(steps):
            for row, (tokens, private, _cached) in self.running.items():
                slot = self.allocator.alloc(1)
                self.rows.req_to_token[row, len(tokens)] = slot.to(torch.int32)[0]
                tokens.append(self.rng.randrange(1, 900))
                private.append(int(slot[0]))

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 100), finish=st.booleans())
    def leave(self, pick, finish):
        row = sorted(self.running)[pick % len(self.running)]
        tokens, private, cached = self.running.pop(row)
        if finish and private:
            # A finished request's output joins the tree (its decode slots become cached).
            key = RadixKey(token_ids(tokens))
            slots = self.rows.req_to_token[row, : len(tokens)].to(torch.int64)
            self.cache.insert(InsertParams(key=key, value=slots, prev_prefix_len=cached))
        elif private:
            # Retracted: its decode slots go back to the allocator; the row keeps them, stale.
            self.allocator.free(torch.tensor(private, dtype=torch.int64))
        self.free_rows.append(row)

    @invariant()
    def grouped_equals_torch_native(self):
        if not self.running:
            return
        rows = sorted(self.running)
        batch = Batch(self.rows, self.kv, torch.tensor(rows), [len(self.running[r][0]) for r in rows], 1)
        segments = find_segments(batch.rows, batch.seq_lens, 1)
        check_segments(segments, batch.rows, 1)
        q = torch.randn(len(rows), HEADS[0], HEADS[2], generator=torch.Generator().manual_seed(len(rows)))
        k, v = self.kv.get_key_buffer(0), self.kv.get_value_buffer(0)
        plan = DecodePlan.build(segments, batch.rows, k[0].numel() * k.element_size())
        got = grouped_decode(q, k, v, plan, 0.25)
        assert torch.allclose(got, torch_native_decode(batch, q, 0.25), atol=2e-5, rtol=0)


DecodeBatches.TestCase.settings = settings(
    max_examples=15, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestDecodeBatches = DecodeBatches.TestCase
