"""SGLang's load report counts a Feather server's waiting uncached tokens exactly, from the CHT."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from conftest import (
    adder_pass,
    batch,
    feather_policy,
    group_prompt,
    make_allocator,
    make_req,
    sglang_schedule_policy,
)
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.scheduler_components.load_inquirer import SchedulerLoadInquirer
from sglang.srt.mem_cache.common import match_kv_cache

from sglang_feather.offline.sglang_objects import cache_prompt, make_radix_cache

PREFIX = 256
"""Four 64-token chunks (Feather's default chunk size), so the coverage in whole chunks is the whole prefix."""
SUFFIX = 40


def inquirer(policy, waiting: list, hit_rate: float = 0.0) -> SchedulerLoadInquirer:
    """SGLang's own load inquirer, wired as `Scheduler.init_load_inquirer` wires it (the fields the waiting-token
    count reads; the rest are not used by it)."""
    wired = {
        "disaggregation_mode": DisaggregationMode.NULL,
        "get_waiting_queue": lambda: waiting,
        "waiting_queue_prefix_matched": lambda: policy.waiting_queue_prefix_matched(waiting),
        "get_recent_cache_hit_rate": lambda: hit_rate,
        "get_chunked_req": lambda: None,
    }
    fields = (f.name for f in dataclasses.fields(SchedulerLoadInquirer) if f.default is dataclasses.MISSING)
    return SchedulerLoadInquirer(**{name: wired.get(name) for name in fields})


def scenario():
    """Group 0's prefix cached, group 1's held by a running request (its prefill in flight, nothing cached),
    group 2 cold; two waiting requests of each."""
    allocator = make_allocator(16384)
    cache = make_radix_cache(allocator=allocator, kv_events=True)
    cache_prompt(cache, group_prompt(0, PREFIX, SUFFIX, salt=99))
    policy = feather_policy(cache)
    leader = make_req("leader", group_prompt(1, PREFIX, SUFFIX, salt=98))
    policy.feather.on_queued(leader)
    admitted = adder_pass(policy, cache, allocator, [leader], batch())
    assert admitted == [leader]
    waiting = [
        make_req(f"g{g}-{i}", group_prompt(g, PREFIX, SUFFIX, salt=i)) for g in range(3) for i in range(2)
    ]
    for req in waiting:
        policy.feather.on_queued(req)
    return cache, policy, waiting


def test_the_report_counts_what_the_cht_does_not_cover():
    cache, policy, waiting = scenario()
    total = sum(req.seqlen for req in waiting)
    report = inquirer(policy, waiting).get_num_waiting_uncached_tokens()
    assert report == total - 2 * PREFIX - 2 * PREFIX  # group 0 cached, group 1 running, group 2 computed
    for req in waiting[:2]:  # the cached part is SGLang's own match
        assert req.num_matched_prefix_tokens == PREFIX
        match_kv_cache(req, cache)
        assert req.prefix_len == PREFIX


def test_without_feather_sglang_estimates_the_report_from_the_recent_hit_rate():
    """SGLang's own predicate for the fcfs base Feather runs as: the server's tree cache (SGLang's Rust radix tree) does not
    match fast, so SGLang reports `seqlen * (1 - recent hit rate)` per waiting request, whatever it shares."""
    _cache, policy, waiting = scenario()
    base = sglang_schedule_policy().waiting_queue_prefix_matched
    assert not base(policy, waiting)
    as_before = SimpleNamespace(waiting_queue_prefix_matched=lambda queue: base(policy, queue))
    hit_rate = 0.5
    estimate = sum(int(r.seqlen * (1 - hit_rate)) for r in waiting)
    exact = inquirer(policy, waiting, hit_rate).get_num_waiting_uncached_tokens()
    assert inquirer(as_before, waiting, hit_rate).get_num_waiting_uncached_tokens() == estimate != exact


def test_a_request_feather_does_not_track_leaves_the_estimate_to_sglang():
    _cache, policy, waiting = scenario()
    stranger = make_req("stranger", group_prompt(0, PREFIX, SUFFIX, salt=7))
    queue = [*waiting, stranger]
    assert not policy.waiting_queue_prefix_matched(queue)
    hit_rate = 0.25
    estimate = sum(int(r.seqlen * (1 - hit_rate)) for r in queue)
    assert inquirer(policy, queue, hit_rate).get_num_waiting_uncached_tokens() == estimate


def test_other_policies_answer_as_sglang_does():
    cache = make_radix_cache()
    waiting = [make_req("r", group_prompt(0, PREFIX, SUFFIX, salt=1))]
    for name in ("fcfs", "lpm", "dfs-weight"):
        ours = type(feather_policy(cache))(name, cache, False, False, False)
        theirs = sglang_schedule_policy()(name, cache, False, False, False)
        assert ours.waiting_queue_prefix_matched(waiting) == theirs.waiting_queue_prefix_matched(waiting)
