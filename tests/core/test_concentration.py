"""The concentration rule: held back only while the pool binds, cold prompts never, a reference model."""

from collections import Counter

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sglang_feather.admission import Admission, AdmissionConfig, KvHeadroom
from sglang_feather.admission.concentration import PRIVATE_WINDOW, Concentration
from sglang_feather.admission.demand import WaitingDemand
from sglang_feather.cht import Candidate
from sglang_feather.sim.engine import SimClock

CHUNK = 4
GROUP_A = [1] * 32  # 8 chunks
GROUP_B = [2] * 32
GROUP_C = [3] * 32


class Pool:
    """A KV pool in tokens: running requests hold their distinct chunks plus `reserve` tokens each (what the
    engine promises them ahead); whatever is not held is room (cached chunks nobody runs count as evictable)."""

    def __init__(self, adm: Admission, capacity: int, reserve: int = 0) -> None:
        self.adm, self.capacity, self.reserve = adm, capacity, reserve

    def held(self, extra: str | None = None) -> int:
        tree = self.adm.tree
        ids = [*tree.active_ids(), *([extra] if extra is not None else [])]
        chunks = {h for rid in ids for h in tree.path_hashes(rid)}
        return len(chunks) * CHUNK + self.reserve * len(ids)

    def room(self) -> KvHeadroom:
        return KvHeadroom(max(0, self.capacity - self.held()), self.capacity)

    def fits(self, rid: str) -> bool:
        return self.held(rid) <= self.capacity


def make(capacity=1000, reserve=0, **kw):
    clock = SimClock()
    config = AdmissionConfig(chunk_size=CHUNK, defer_uncached_prefix=False, cache_events=True, **kw)
    adm = Admission.from_config(config, clock=clock)
    return adm, Pool(adm, capacity, reserve), clock


def run_pass(adm: Admission, pool: Pool, max_requests=None) -> tuple[str, ...]:
    plan = adm.select(adm.num_active, max_requests=max_requests, fits=pool.fits, headroom=pool.room)
    for rid in plan.admitted:  # the engine's cache holds what ran
        adm.cache_stored(adm.tree.path_hashes(rid))
    return plan.admitted


def warm_up(adm, pool):
    """Three requests of group A in one pass: the second joins A, and its drop of the room, read at the third's
    decision, measures `p` (8 tail tokens plus the pool's reserve); 56 tokens held without a reserve."""
    for i in range(3):
        adm.enqueue(f"w{i}", GROUP_A + [5 + i] * 8)
    assert run_pass(adm, pool) == ("w0", "w1", "w2")


def cached_b_and_two_of_a(adm):
    """Group B's 72-token prefix cached (deeper than A's 32 that run: the ranking offers B first), two of B's
    requests and two of A's waiting."""
    adm.cache_stored(_chain(adm, B_PREFIX))
    adm.enqueue("b0", B_PREFIX + [7] * 4)
    adm.enqueue("b1", B_PREFIX + [8] * 4)
    adm.enqueue("a3", GROUP_A + [9] * 8)
    adm.enqueue("a4", GROUP_A + [10] * 8)


B_PREFIX = GROUP_B + [3] * 40


def test_a_new_prefix_waits_while_the_running_groups_need_the_room():
    adm, pool, _ = make(capacity=100)
    warm_up(adm, pool)
    assert adm.concentration.mean_cost_tokens == 8
    cached_b_and_two_of_a(adm)
    assert run_pass(adm, pool) == ("a3", "a4"), "B's 76 tokens would take the room of A's 8-token tails"
    assert adm.stats.num_concentrated == 2, "b0 by the rule, then b1: the pass was closed to new prefixes"
    assert adm.is_waiting("b0") and not adm.tree.is_suspended("b0"), "held for one pass only"
    for rid in ("w0", "w1", "w2", "a3", "a4"):
        adm.finish(rid)
    assert run_pass(adm, pool) == ("b0", "b1"), "with no running group's request waiting, B enters"


def test_a_cached_prompt_nothing_else_waiting_shares_is_not_held_back():
    """A chat turn: its own history is cached beyond the running group's prefix, and no other waiting request
    shares it. It costs its prompt whenever it runs, so holding it back only lets its history be evicted."""
    adm, pool, _ = make(capacity=100)
    warm_up(adm, pool)
    history = GROUP_A + [6] * 8 + [40] * 24  # w1's prompt, then its answer and the next question
    adm.cache_stored(_chain(adm, history))
    adm.enqueue("turn2", history + [41] * 4)
    adm.enqueue("a3", GROUP_A + [9] * 8)
    candidate = adm.tree.candidate("turn2")
    assert candidate.depth_cached > candidate.depth_running
    assert not Concentration.locks_new_prefix(candidate, adm.tree)
    adm.enqueue("twin", history + [42] * 4)
    assert Concentration.locks_new_prefix(candidate, adm.tree), (
        "another waiting request shares the cached part: admitting one locks it for both"
    )
    adm.abort("twin")
    assert run_pass(adm, pool)[0] == "turn2", "the deepest cached prefix first, and not held"
    assert adm.stats.num_concentrated == 0


def test_where_the_pool_holds_everything_the_rule_stays_out_of_the_way():
    adm, pool, _ = make(capacity=10_000)
    warm_up(adm, pool)
    cached_b_and_two_of_a(adm)
    assert run_pass(adm, pool) == ("b0", "b1", "a3", "a4")
    assert adm.stats.num_concentrated == 0


def test_a_held_request_past_the_bound_waits_while_the_pool_binds_and_a_cold_prompt_is_never_held():
    adm, pool, clock = make(capacity=140, max_wait_s=10.0, due_when_overtaken=False)
    warm_up(adm, pool)
    cached_b_and_two_of_a(adm)
    assert run_pass(adm, pool) == ("a3", "a4") and adm.stats.num_concentrated == 2
    adm.finish("a3"), adm.finish("a4")
    adm.enqueue("a5", GROUP_A + [11] * 8)
    clock.now += 10.0
    assert run_pass(adm, pool) == ("a5",), "b0 reached the bound, but A's a5 waits and the pool binds"
    assert adm.stats.num_aged == 0 and adm.stats.num_concentrated == 4
    for rid in ("w0", "w1", "w2", "a5"):
        adm.finish(rid)
    assert run_pass(adm, pool)[0] == "b0", "nothing of a running group waits: the guard admits b0 first"
    assert adm.stats.num_aged == 1
    adm.enqueue("cold", [9] * 64)
    candidate = adm.tree.candidate("cold")
    assert not Concentration.locks_new_prefix(candidate, adm.tree), "nothing shares its prompt"


def test_p_is_the_rooms_drop_per_admission_and_the_promise_what_it_takes_beyond_the_prompt():
    adm, pool, _ = make(capacity=10_000, reserve=5)
    for i in range(3):
        adm.enqueue(f"a{i}", GROUP_A + [10 + i] * 8)
    adm.enqueue("x", [7] * 4)
    assert run_pass(adm, pool) == ("a0", "a1", "a2", "x")
    conc = adm.concentration
    assert conc.mean_cost_tokens == 8 + 5, "a1 and a2 joined A: 8 tail tokens and 5 promised each"
    assert conc.promise_tokens == 5
    for rid in ("a0", "a1", "a2", "x"):
        adm.finish(rid)
    adm.enqueue("c0", GROUP_A + [50] * 8)
    for i in range(2 * PRIVATE_WINDOW + 2):
        adm.enqueue(f"b{i}", GROUP_A + [60 + i] * 4)
    run_pass(adm, pool)
    assert conc.mean_cost_tokens == 4 + 5, (
        "the room is read before the pass's 64th admission: b0-b62 joined c0's group in one run of 63 "
        "measured admissions, which alone covers the window (a1 and a2's run of 13 each left it)"
    )


def _joins(rid: str, num_private: int) -> Candidate:
    """A candidate that joins a running prefix of 8 chunks with `num_private` chunks of its own."""
    return Candidate(rid, 8 + num_private, num_private, 8, 8, 8, 8, 0, 0.0)


def _new_group(rid: str) -> Candidate:
    return Candidate(rid, 8, 8, 0, 0, 8, 0, 0, 0.0)


def test_a_run_is_read_where_it_turns_and_before_the_passs_power_of_two_admissions():
    """Step by step (a read at every decision), the rule uses the reads before the 1st, 2nd, 4th, ... admission
    and where measured and unmeasured admissions meet; a pass that ends with no read after its last admission
    measures its run up to the last used read. A plan (measured picks only) after the pass's first admission
    reads at exactly those points and replays to the same `p`."""
    conc = Concentration(CHUNK)
    picks = [_new_group("g"), *(_joins(f"j{i}", 1 + i % 3) for i in range(6))]
    room = 10_000
    for pick in picks[:6]:  # g, then j0-j4 take 4 + (1 + i % 3) * 4 tokens each (a promise of 4)
        conc.room_seen(KvHeadroom(room, 20_000))
        conc.admitted(pick)
        room -= 8 * CHUNK + 4 if pick.adds_group else 4 + pick.num_missing * CHUNK
    conc.pass_ended()  # j4 was the last admission: nothing read the room after it
    # reads used: before g (k=0), j0 (k=1, measured after unmeasured), j1 (k=2), j3 (k=4): the run j0-j2
    assert conc.mean_cost_tokens == (8 + 12 + 16) / 3
    assert conc.promise_tokens == 4
    planned = Concentration(CHUNK)
    planned.room_seen(KvHeadroom(10_000, 20_000))
    planned.admitted(picks[0])  # g steps; j0-j5 are planned after it
    assert planned.read_points(0, 6) == [True, True, False, True, False, False]
    planned.replay({0: 9_964, 1: 9_956, 3: 9_928}, picks[1:6])
    planned.pass_ended()
    assert (planned.mean_cost_tokens, planned.promise_tokens) == (conc.mean_cost_tokens, conc.promise_tokens)


@pytest.mark.parametrize("last_step_measured", [True, False])
def test_a_planned_blocks_reads_are_the_read_points_of_measured_admissions(last_step_measured):
    """`read_points` (a power of two at a time) against `_is_read_point` asked at every admission of a block of
    measured picks, for plans after 0-69 step admissions of the pass (the last measured or not) and blocks
    after 0 or more earlier picks of the plan."""
    for num_steps in range(70):
        conc = Concentration(CHUNK)
        for i in range(num_steps):
            measured = last_step_measured or i < num_steps - 1
            conc.admitted(_joins(f"s{i}", 1) if measured else _new_group(f"s{i}"))
        for num_planned in (0, 1, 3, 30):
            start = num_steps + num_planned
            if num_planned:
                after = True  # the plan's earlier picks, all measured
            else:
                after = None if num_steps == 0 else last_step_measured
            for num_picks in (0, 1, 2, 3, 7, 40, 130):
                expected = [
                    Concentration._is_read_point(k, after if k == start else True, True)
                    for k in range(start, start + num_picks)
                ]
                assert conc.read_points(num_planned, num_picks) == expected, (
                    num_steps,
                    num_planned,
                    num_picks,
                )


def test_off_holds_nothing_and_either_way_passes_can_be_planned():
    adm, pool, _ = make(capacity=32 + 8 * 3, concentrate=False)
    assert adm.concentration is None and adm.can_plan and adm.num_waiting_running is None
    assert make()[0].can_plan, "on, a planned pass ends before a pick the rule could hold back"


def _chain(adm: Admission, tokens: list[int]):
    """The chunk hash chain of `tokens` as the tree hashes them (a request enqueued and dropped to read it)."""
    adm.enqueue("_probe", tokens)
    chain = adm.tree.path_hashes("_probe")
    adm.abort("_probe")
    return chain


# ----------------------------------------------------------------- against a reference model


def used_reads(events: list[tuple]) -> list[tuple]:
    """The log with only the reads the rule uses: a read followed by an admission where a run may start or
    end (the pass's first admission, a change between measured and not) or before the pass's 1st, 2nd, 4th,
    ... admission; or the pass's last read when no admission follows it. A read followed by another read
    before any admission gives way to it."""
    kept: list[tuple] = []
    read = None
    num_admitted, last = 0, None
    for event in events:
        if event[0] == "read":
            read = event
            continue
        if event[0] == "admit":
            measured = event[1]
            power = num_admitted & (num_admitted - 1) == 0
            if read is not None and (last is None or last != measured or power):
                kept.append(read)
            num_admitted, last = num_admitted + 1, measured
        else:  # the pass's end
            if read is not None:
                kept.append(read)
            num_admitted, last = 0, None
        read = None
        kept.append(event)
    return kept


def reference_runs(events: list[tuple]) -> list[tuple[int, int, int]]:
    """The measured runs from scratch, from the rule's event log: ("read", room or None), ("admit", measured,
    prompt tokens) and ("end",), of which the rule uses the reads `used_reads` keeps. Measured admissions with
    a used read before and after them (no other admission between) form a run with the measured admissions
    before them when nothing else came between; a run took the room's drop from the used read before its first
    admission to the last used read after them."""
    runs: list[tuple[int, int, int]] = []  # (taken, prompt, admissions)
    start = last = None  # the open run's first read; the last used read
    since: list[tuple[bool, int]] = []
    run_end = run_prompt = run_num = 0
    for event in used_reads(events):
        if event[0] == "admit":
            since.append((event[1], event[2]))
            continue
        if event[0] == "end":
            if start is not None:
                runs.append((max(0, start - run_end), run_prompt, run_num))
            start = last = None
            since = []
            continue
        room = event[1]
        if since:
            if all(m for m, _ in since) and last is not None and room is not None:
                if start is None:
                    start, run_prompt, run_num = last, 0, 0
                run_end, run_prompt, run_num = (
                    room,
                    run_prompt + sum(q for _, q in since),
                    run_num + len(since),
                )
            elif start is not None:
                runs.append((max(0, start - run_end), run_prompt, run_num))
                start = None
        last, since = room, []
    if start is not None:
        runs.append((max(0, start - run_end), run_prompt, run_num))
    return runs


def reference_holds_back(adm: Admission, events: list[tuple], candidate, room, early) -> bool:
    """The rule from scratch: group counts recounted from the tree, `p` and the promise from the newest runs of
    room drops the log shows that cover the last PRIVATE_WINDOW measured admissions."""
    window: list[tuple[int, int, int]] = []
    for run in reversed(reference_runs(events)):
        if sum(n for *_, n in window) >= PRIVATE_WINDOW:
            break
        window.append(run)
    tree = adm.tree
    if not window or room is None:
        return False
    waiting = Counter(tree.prefix_hash(r) for r in tree.waiting_ids())
    running = {tree.prefix_hash(r) for r in tree.active_ids()}
    num_waiting_running = sum(n for g, n in waiting.items() if g in running)
    if not early and num_waiting_running == 0:
        return False
    group = tree.prefix_hash(candidate.request_id)
    adds_group = group not in running
    rid, depth = candidate.request_id, candidate.depth_running
    shares_cached = any(
        other != rid and tree.shares_prefix(rid, other, depth + 1) for other in tree.waiting_ids()
    )
    locks = (candidate.depth_cached > depth and shares_cached) or (adds_group and waiting[group] > 1)
    if not locks:
        return False
    num = sum(n for *_, n in window)
    p = sum(t for t, _, _ in window) / num
    promise = max(0.0, sum(t - q for t, q, _ in window) / num)
    cost = round((candidate.num_chunks - candidate.depth_running) * CHUNK + promise)
    return cost > p and cost + round(sum(waiting.values()) * p) > room.num_free_tokens


PROMPTS = st.builds(
    lambda group, branch, tail: [group] * 16 + [branch] * 8 + [100 + tail] * tail,
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 12),
)


class ConcentrationMachine(RuleBasedStateMachine):
    """Random arrivals, passes, finishes and evictions through `select` against a `Pool`: every hold the rule
    makes equals the reference model's verdict, nothing is held while nothing of a running group waits (but an
    early pick), a pass on an empty engine admits something, the running groups' waiting demand equals a recount, and every request
    is admitted at most once and leaves once."""

    def __init__(self):
        super().__init__()
        self.adm, self.pool, self.clock = make(capacity=160, reserve=3, max_wait_s=50.0)
        self.n = 0
        self.events: list[tuple] = []
        self.admitted: Counter = Counter()
        self.left: Counter = Counter()
        self.num_checked = 0
        conc = self.adm.concentration
        original_holds, original_seen = conc.holds_back, conc.room_seen
        original_admitted, original_ended = conc.admitted, conc.pass_ended

        def holds_back(candidate, num_waiting_running, room, tree, early=False):
            verdict = original_holds(candidate, num_waiting_running, room, tree, early)
            assert verdict == reference_holds_back(self.adm, self.events, candidate, room, early)
            self.num_checked += 1
            return verdict

        def room_seen(room):
            self.events.append(("read", None if room is None else room.num_free_tokens))
            original_seen(room)

        def admitted(candidate):
            measured = Concentration.is_measured(candidate)
            self.events.append(("admit", measured, conc.prompt_tokens(candidate) if measured else 0))
            original_admitted(candidate)

        def pass_ended():
            self.events.append(("end",))
            original_ended()

        conc.holds_back, conc.room_seen = holds_back, room_seen
        conc.admitted, conc.pass_ended = admitted, pass_ended

    @rule(prompt=PROMPTS, count=st.integers(1, 4))
    def arrive(self, prompt, count):
        for _ in range(count):
            self.n += 1
            self.adm.enqueue(f"r{self.n}", prompt)

    @rule()
    def schedule(self):
        was_empty = self.adm.num_active == 0 and self.adm.num_waiting > 0
        admitted = run_pass(self.adm, self.pool)
        self.admitted.update(admitted)
        if was_empty and any(self.pool.fits(rid) for rid in self.adm.tree.waiting_ids()):
            assert admitted, "an empty engine with a request that fits admitted nothing"

    @precondition(lambda self: self.adm.num_active)
    @rule(pick=st.integers(0, 100))
    def finish(self, pick):
        active = sorted(self.adm.tree.active_ids())
        rid = active[pick % len(active)]
        self.adm.finish(rid)
        self.left[rid] += 1

    @rule(seconds=st.floats(0.0, 30.0))
    def wait(self, seconds):
        self.clock.now += seconds

    @precondition(lambda self: self.adm.num_waiting + self.adm.num_active)
    @rule(pick=st.integers(0, 100))
    def evict(self, pick):
        ids = sorted([*self.adm.tree.waiting_ids(), *self.adm.tree.active_ids()])
        chain = self.adm.tree.path_hashes(ids[pick % len(ids)])
        self.adm.cache_removed([chain[min(len(chain) - 1, pick % 7)]])

    @invariant()
    def demand_matches_a_recount(self):
        tree = self.adm.tree
        running = {tree.prefix_hash(r) for r in tree.active_ids()}
        waiting = Counter(tree.prefix_hash(r) for r in tree.waiting_ids())
        assert self.adm.num_waiting_running == sum(n for g, n in waiting.items() if g in running)
        assert self.adm.num_waiting_running == WaitingDemand.recount(tree).num_waiting_running

    @invariant()
    def each_request_admitted_and_left_at_most_once(self):
        assert all(n == 1 for n in self.admitted.values())
        assert all(n == 1 for n in self.left.values()) and set(self.left) <= set(self.admitted)
        assert self.adm.tree.num_suspended == 0, "a hold lasts one pass"

    def teardown(self):
        while self.adm.num_waiting or self.adm.num_active:  # drain: nothing is stuck
            for rid in sorted(self.adm.tree.active_ids()):
                self.adm.finish(rid)
            admitted = run_pass(self.adm, self.pool)
            assert admitted or not self.adm.num_waiting, "a drained engine admits what waits"


TestConcentrationMachine = ConcentrationMachine.TestCase
TestConcentrationMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_the_machine_reaches_holds():
    """The machine above is not vacuous: a fixed run of its rules makes holds the reference agrees with."""
    machine = ConcentrationMachine()
    for i in range(40):
        machine.arrive([1] * 16 + [1] * 8 + [100 + i % 12] * (1 + i % 12), 1)
        machine.arrive([2 + i % 3] * 16 + [1] * 8 + [100 + i % 5] * (1 + i % 5), 2)
        machine.schedule()
        if i % 3 == 0 and machine.adm.num_active:
            machine.finish(i)
    assert machine.num_checked > 0 and reference_runs(machine.events)
    assert machine.adm.stats.num_concentrated > 0
    machine.teardown()


@settings(max_examples=300, deadline=None)
@given(
    before=st.lists(st.booleans(), max_size=6),
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=40),
    data=st.data(),
)
def test_a_replayed_plan_books_what_the_step_path_books(before, sizes, data):
    """`replay` (which skips the reads that only extend the open run) against the step path's `room_seen` and
    `admitted` at each of the plan's reads, after step admissions earlier in the pass (measured or not), with
    reads the engine could not answer, a refusal read or none, over several passes."""
    step, planned = Concentration(CHUNK), Concentration(CHUNK)
    for _ in range(3):
        room = 50_000
        for conc in (step, planned):  # the pass's admissions before the plan, step by step
            r = room
            for i, measured in enumerate(before):
                pick = _joins(f"s{i}", 2) if measured else _new_group(f"s{i}")
                conc.room_seen(KvHeadroom(r, 100_000))
                conc.admitted(pick)
                r -= 4 + pick.num_missing * CHUNK
        room -= sum(4 + (2 if m else 8) * CHUNK for m in before)
        picks = [_joins(f"p{i}", size) for i, size in enumerate(sizes)]
        reads = planned.read_points(0, len(picks))
        num_admitted = data.draw(st.integers(0, len(picks)))
        rooms: dict[int, int | None] = {}
        for k in range(num_admitted + 1):
            if (
                k < num_admitted
                and reads[k]
                or k == num_admitted
                and k < len(picks)
                and data.draw(st.booleans())
            ):
                rooms[k] = None if data.draw(st.integers(0, 5)) == 0 else room
            if k < num_admitted:
                room -= 4 + picks[k].num_missing * CHUNK
        for k, pick in enumerate(picks[:num_admitted]):
            if k in rooms:
                step.room_seen(None if rooms[k] is None else KvHeadroom(rooms[k], 100_000))
            step.admitted(pick)
        if num_admitted in rooms:
            step.room_seen(None if rooms[num_admitted] is None else KvHeadroom(rooms[num_admitted], 100_000))
        planned.replay(rooms, picks[:num_admitted])
        step.pass_ended()
        planned.pass_ended()
        assert (planned.mean_cost_tokens, planned.promise_tokens) == (
            step.mean_cost_tokens,
            step.promise_tokens,
        )
        assert list(planned._runs) == list(step._runs)
