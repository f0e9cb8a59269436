"""Within a pass, one engine cache match answers for every waiting request that shares its frontier chunk."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_feather.admission import Admission, AdmissionConfig
from sglang_feather.sim.engine import SimClock


class PrefixCache:
    """An engine prefix cache: the longest page-aligned cached prefix of a prompt, never the whole prompt."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self.prefixes: set[tuple[int, ...]] = set()
        self.num_matches = 0

    def publish(self, prompt: list[int]) -> None:
        for end in range(self.page_size, len(prompt) + 1, self.page_size):
            self.prefixes.add(tuple(prompt[:end]))

    def hit(self, prompt: list[int]) -> int:
        self.num_matches += 1
        hit = 0
        for end in range(self.page_size, len(prompt), self.page_size):
            if tuple(prompt[:end]) not in self.prefixes:
                break
            hit = end
        return hit


def make(page_size: int, chunk_size: int = 8, max_wait_s: float | None = None) -> Admission:
    config = AdmissionConfig(
        chunk_size=chunk_size, stopper="always", page_size=page_size, max_wait_s=max_wait_s
    )
    return Admission.from_config(config, clock=SimClock())


def without_frontiers(adm: Admission) -> Admission:
    """The reference: every in-flight check asks the engine."""
    adm._in_flight._cached_tokens = lambda tree, candidate, cached_tokens: cached_tokens(candidate.request_id)
    return adm


def test_a_cold_group_costs_one_cache_match_per_pass():
    prompts = {f"{g}{i}": [g] * 40 + [100 + i] * 8 for g in (1, 2, 3) for i in range(6)}
    cache, adm = PrefixCache(page_size=4), make(page_size=4)
    for rid, prompt in prompts.items():
        adm.enqueue(rid, prompt)
    first = adm.select(0, cached_tokens=lambda rid: cache.hit(prompts[rid]))
    assert first.admitted == ("10", "20", "30"), "one leader per group; their prefixes are computing"
    cache.num_matches = 0
    second = adm.select(3, cached_tokens=lambda rid: cache.hit(prompts[rid]))
    assert second.admitted == () and adm.stats.num_deferred == 2 * 15
    assert cache.num_matches == 3, "one match per group, not one per follower"
    for rid in ("10", "20", "30"):
        cache.publish(prompts[rid])
    third = adm.select(3, cached_tokens=lambda rid: cache.hit(prompts[rid]))
    assert len(third.admitted) == 15, "the leaders' prefixes are cached: every follower joins"


def test_a_hit_that_ends_in_a_prompts_last_chunk_answers_for_no_other_request():
    """A prompt's hit can stop short only because its last token is always computed: a longer prompt with
    the same chunks hits further, so that frontier is not reused even if the engine skips the request."""
    cache, adm = PrefixCache(page_size=4), make(page_size=4)
    prompts = {"running": [7] * 32, "short": [7] * 16, "long": [7] * 24 + [9] * 8}
    adm.enqueue("running", prompts["running"])
    adm.select(0)
    cache.publish(prompts["running"])
    adm.enqueue("short", prompts["short"])
    adm.enqueue("long", prompts["long"])

    def hit(rid):
        return cache.hit(prompts[rid])

    adm.begin_pass()
    short = adm.decide(adm.pick_request("short", cached_tokens=hit), 1)
    assert not short.is_deferred and hit("short") == 12
    adm.skip(short)
    long = adm.decide(adm.pick_request("long", cached_tokens=hit), 1)
    assert not long.is_deferred, "its 24 shared tokens are cached (hit 24), not 12 like the short prompt's"
    adm.end_pass()


def test_a_hit_whose_uncached_page_straddles_a_chunk_end_answers_for_no_other_request():
    """Pages of 4, chunks of 6: the short-falling page [16, 20) runs past the shared chunks [0, 18), where
    two branches differ; the other branch's page is cached, so its requests hit further."""
    cache, adm = PrefixCache(page_size=4), make(page_size=4, chunk_size=6)
    prompts = {
        "computing": [1] * 18 + [2] * 12,
        "cached": [1] * 18 + [3] * 12,
        "x": [1] * 18 + [2] * 12 + [5] * 6,
        "f": [1] * 18 + [3] * 12 + [6] * 6,
    }

    def hit(rid):
        return cache.hit(prompts[rid])

    adm.enqueue("computing", prompts["computing"])
    adm.enqueue("cached", prompts["cached"])
    assert adm.select(0, cached_tokens=hit).admitted == ("computing",)
    assert adm.select(1).admitted == ("cached",)
    cache.publish(prompts["cached"])
    adm.enqueue("x", prompts["x"])
    adm.enqueue("f", prompts["f"])
    plan = adm.select(2, cached_tokens=hit)
    assert hit("x") == 16 and hit("f") == 28
    assert plan.admitted == ("f",), "x waits for the computing prefix; f's shared prefix is cached"


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([4, 6, 8, 12]),
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(1, 40)), min_size=1, max_size=40),
    st.lists(st.tuples(st.integers(0, 3), st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=8),
)
def test_frontiers_decide_exactly_like_asking_the_engine(
    page_size, chunk_size, publish_on_admit, requests, passes
):
    """Random prompt trees, a cache that fills between passes (and, like vLLM's, at admission when
    `publish_on_admit`), requests aging past the bound mid-pass, finishes: plans equal the reference's."""
    prompts = {  # groups and branches diverge at offsets that are not chunk or page boundaries
        f"r{i}": [group] * (13 + 5 * group) + [10 + branch] * 11 + [50 + i] * tail
        for i, (group, branch, tail) in enumerate(requests)
    }
    caches = [PrefixCache(page_size), PrefixCache(page_size)]
    engines = [make(page_size, chunk_size, 1.0), without_frontiers(make(page_size, chunk_size, 1.0))]

    def fits(adm, cache):
        def admit(rid):
            adm.clock.now += 0.25  # a slow admission: requests reach the aging bound during the pass
            if publish_on_admit:
                cache.publish(prompts[rid])
            return True

        return admit

    pending = list(prompts)
    for num_arrivals, publish_share, finish_share in passes:
        arrivals, pending = pending[: num_arrivals * 4], pending[num_arrivals * 4 :]
        plans = []
        for adm, cache in zip(engines, caches, strict=True):
            for rid in arrivals:
                adm.enqueue(rid, prompts[rid])
            plans.append(
                adm.select(
                    adm.tree.num_active,
                    fits=fits(adm, cache),
                    cached_tokens=lambda r, c=cache: c.hit(prompts[r]),
                )
            )
        assert plans[0] == plans[1]
        active = sorted(engines[0].tree.active_ids())
        assert active == sorted(engines[1].tree.active_ids())
        for rid in active[: int(len(active) * publish_share)]:
            for cache in caches:
                cache.publish(prompts[rid])
        for rid in active[: int(len(active) * finish_share)]:
            for adm in engines:
                adm.finish(rid)
