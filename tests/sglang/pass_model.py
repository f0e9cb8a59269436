"""SGLang's prefill passes on real objects, with the radix cache published when SGLang publishes it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from conftest import batch, idle_plan, make_allocator, make_req, scheduler_view
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

from sglang_feather.offline.sglang_objects import cache_prompt, make_radix_cache
from sglang_feather.sglang.policy import FeatherSchedulePolicy
from sglang_feather.sglang.scheduler_hooks import on_queued, on_step_end
from sglang_feather.workload import SharedPrefixSpec, concat_tokens

# How it works.
#
# Each `step()` is one `_get_new_batch_prefill_raw`: `calc_priority`, the chunked request's next chunk
# (`add_chunked_req`), then SGLang's loop over the waiting queue with the real `PrefillAdder` (the policy's
# adder class for Feather), stopping at the first non-CONTINUE result. The batch's computed tokens reach the
# RadixCache the way `process_batch_result` puts them there: with SGLang's default overlap event loop the
# result of batch k is processed after pass k+1 has been scheduled, so pass k+1 cannot see batch k's
# prefixes; with `--disable-overlap-schedule` it is processed before. Admitted requests keep running (no
# model, no decode), so their chunks stay in Feather's working set. A request split by chunked prefill
# resumes from its own computed chunks, published at once (the model lets it re-match them in the cache); a
# finished chunked request's last chunk follows the batch timing above. A *cold prefill* is an admission that
# computes some of its group's shared prefix.


@dataclass
class PassStats:
    num_passes: int = 0
    cold_prefills: Counter = field(default_factory=Counter)
    """Group -> admissions that computed part of the group's shared prefix."""
    admitted: list = field(default_factory=list)


class PassModel:
    def __init__(
        self,
        policy_name: str,
        options=None,
        *,
        overlap: bool = True,
        page_size: int = 1,
        max_prefill_tokens: int = 16384,
        chunked_prefill_size: int | None = None,
    ) -> None:
        self.allocator = make_allocator(1 << 22)
        self.cache = make_radix_cache(allocator=self.allocator, page_size=page_size)
        self.policy = FeatherSchedulePolicy(policy_name, self.cache, False, False, False)
        if options is not None:
            self.policy.configure(options)
        self.overlap = overlap
        self.page_size = page_size
        self.max_prefill_tokens = max_prefill_tokens
        self.chunked_prefill_size = chunked_prefill_size
        self.waiting_queue: list = []
        self.running = batch()
        self.chunked_req = None
        self.in_flight: list = []
        self.group_of: dict = {}
        self.prefix_len_of: dict = {}
        self.stats = PassStats()

    def add(self, rid: str, ids: list[int], group: int, prefix_len: int) -> None:
        req = make_req(rid, ids, max_new_tokens=64)
        self.group_of[rid] = group
        self.prefix_len_of[rid] = prefix_len
        self.waiting_queue.append(req)
        if self.policy.feather is not None:
            on_queued(self.view(), req)

    def view(self):
        return scheduler_view(self.policy, self.waiting_queue, self.chunked_req)

    def step(self) -> list:
        self.stats.num_passes += 1
        self.policy.calc_priority(self.waiting_queue, self.running)
        adder_cls = self.policy.prefill_adder_class(PrefillAdder)
        adder = adder_cls(
            self.page_size,
            self.cache,
            self.allocator,
            self.running,
            0.0,
            self.max_prefill_tokens,
            self.chunked_prefill_size,
        )
        continuing = self.chunked_req
        if continuing is not None:
            continuing.init_next_round_input(self.cache)
            self.chunked_req = adder.add_chunked_req(continuing)
        for req in self.waiting_queue:
            req.init_next_round_input(self.cache)
            prefix_before = req.prefix_len
            result = adder.add_one_req(
                req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None
            )
            if adder.can_run_list and adder.can_run_list[-1] is req:
                self._count_admission(req, prefix_before)
            if result is not AddReqResult.CONTINUE:
                break
        admitted = [r for r in adder.can_run_list if r is not continuing]
        chosen = set(adder.can_run_list)
        self.waiting_queue[:] = [r for r in self.waiting_queue if r not in chosen]
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        self.running.reqs.extend(r for r in adder.can_run_list if r is not self.chunked_req)
        computed = [(req, req.extend_end) for req in adder.can_run_list if req is not self.chunked_req]
        if self.chunked_req is not None:
            self._publish([(self.chunked_req, self.chunked_req.extend_end)])
        if self.overlap:
            self._publish(self.in_flight)
            self.in_flight = computed
        else:
            self._publish(computed)
        if self.policy.feather is not None:
            on_step_end(self.view(), idle_plan(self.running))
        return admitted

    def run(self, max_steps: int = 200) -> PassStats:
        for _ in range(max_steps):
            if not self.waiting_queue and self.chunked_req is None:
                break
            self.step()
        self._publish(self.in_flight)
        self.in_flight = []
        return self.stats

    def _count_admission(self, req, prefix_before: int) -> None:
        self.stats.admitted.append(req.rid)
        shared = self.prefix_len_of[req.rid] // self.page_size * self.page_size
        if prefix_before < shared:
            self.stats.cold_prefills[self.group_of[req.rid]] += 1

    def _publish(self, computed) -> None:
        for req, end in computed:
            ids = req.full_untruncated_fill_ids[:end]
            end = len(ids) // self.page_size * self.page_size
            if end == 0:
                continue
            cache_prompt(self.cache, ids[:end], self.allocator.alloc(end))


def group_requests(num_groups: int, group_size: int, prefix_len: int, suffix_len: int, seed: int):
    """Shuffled arrivals of `num_groups` groups that share a `prefix_len`-token prefix each."""
    spec = SharedPrefixSpec.per_group(
        num_groups, group_size, prefix_len=prefix_len, question_len=suffix_len, seed=seed
    )
    for req in spec.requests():
        yield req.rid, concat_tokens(req.segments).tolist(), req.group, prefix_len
