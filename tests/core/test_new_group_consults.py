"""The stopper under continuous batching: consulted on candidates that add a prefix group, seeing their costs."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sglang_feather.admission import Admission, AdmissionConfig, KvHeadroom, StopReason
from sglang_feather.admission.costs import NoFootprint
from sglang_feather.cht import RequestState
from sglang_feather.policy import Decision, Observation, make_policy
from sglang_feather.policy.base import PolicyBase
from sglang_feather.sim.engine import SimClock

GROUP_A = [1] * 32
GROUP_B = [2] * 32
GROUP_C = [3] * 32


class Recorder(PolicyBase):
    """Says STOP to every candidate that adds a prefix group (ADD otherwise) and keeps what it saw."""

    name = "recorder"

    def __init__(self, stop_new_groups: bool = True) -> None:
        super().__init__()
        self.seen: list[Observation] = []
        self.stop_new_groups = stop_new_groups

    def decide(self, obs: Observation) -> Decision:
        self.seen.append(obs)
        return Decision.STOP if self.stop_new_groups and obs.adds_group and obs.batch_size else Decision.ADD


def make(stopper=None, scope="new-groups", **kw):
    clock = SimClock()
    adm = Admission.from_config(AdmissionConfig(chunk_size=4, stop_scope=scope, **kw), clock=clock)
    if stopper is not None:
        adm.stopper = stopper
    return adm, clock


def test_a_new_group_in_a_mixed_batch_is_consulted_with_its_costs():
    rec = Recorder(stop_new_groups=False)
    adm, clock = make(rec)
    adm.enqueue("a0", GROUP_A + [5])
    adm.enqueue("b0", GROUP_B + [5])
    adm.select(0)
    assert adm.tree.num_active == 2 and adm.footprint.num_groups == 2
    clock.now = 3.0
    adm.enqueue("c0", GROUP_C + [7])
    adm.enqueue("c1", GROUP_C + [8])
    adm.enqueue("a1", GROUP_A + [6])
    rec.seen.clear()
    consults = adm.stats.num_consults
    adm.select(2, headroom=lambda: KvHeadroom(250, 1000))
    by_batch = {o.batch_size: o for o in rec.seen}
    a1, c0 = by_batch[2], by_batch[3]
    assert not a1.adds_group and a1.delta == 0, "a1's group runs: nothing new is at stake"
    assert c0.adds_group and c0.delta == 0, "the mixed batch shares no prefix, so Δ is 0 for everyone"
    assert c0.num_groups_running == 2
    assert c0.num_running_chunks == 2 * 9 + 1, "a0's 9 chunks, b0's 9, a1's own last chunk"
    assert c0.num_read_chunks == 3 * 9, "a0, b0 and a1 hold 9 chunks each, counted per request"
    assert c0.num_chunks == 9
    assert c0.num_new_chunks == 9 and c0.num_missing == 9
    assert c0.num_group_waiting == 1, "c1 waits in its group"
    assert c0.oldest_wait_s == 0.0 and c0.kv_free_fraction == 0.25
    assert adm.stats.num_consults - consults == 1 and adm.stats.num_group_consults >= 1


def test_a_stop_under_the_new_groups_scope_lets_running_groups_join():
    rec = Recorder()
    adm, _ = make(rec)
    adm.enqueue("a0", GROUP_A + [5])
    adm.select(0)
    adm.enqueue("c0", GROUP_C + [1])
    adm.enqueue("a1", GROUP_A + [6])
    adm.enqueue("c1", GROUP_C + [2])
    adm.enqueue("a2", GROUP_A + [7])
    plan = adm.select(1)
    assert set(plan.admitted) == {"a1", "a2"} and plan.stop is StopReason.STOPPER
    assert adm.stats.num_stops == 1, "one STOP closed the pass to new groups"
    assert adm.is_waiting("c0") and adm.is_waiting("c1")
    assert not adm.tree.is_suspended("c0"), "held back for that pass only"


def test_a_stop_under_the_pass_scope_ends_the_pass():
    rec = Recorder()
    adm, _ = make(rec, scope="pass")
    adm.enqueue("a0", GROUP_A + [5])
    adm.select(0)
    adm.enqueue("c0", GROUP_C + [1])
    adm.select(1)  # c0 cached? no: it is a stranger, offered and stopped
    adm.enqueue("a1", GROUP_A + [6])
    plan = adm.select(1)
    assert plan.admitted == ("a1",), "a running group's request ranks first (covered)"
    assert adm.select(2) == type(plan)((), StopReason.STOPPER)
    assert adm.is_waiting("c0")


def test_an_aged_new_group_is_admitted_without_asking():
    rec = Recorder()
    adm, clock = make(rec, max_wait_s=10.0, due_when_overtaken=False)
    adm.enqueue("a0", GROUP_A + [5])
    adm.select(0)
    adm.enqueue("c0", GROUP_C + [1])
    assert adm.select(1).admitted == ()
    clock.now = 10.0
    consults = adm.stats.num_consults
    assert adm.select(1).admitted == ("c0",)
    assert adm.stats.num_aged == 1 and adm.stats.num_consults == consults


# ----------------------------------------------------------------- the footprint against a recount


PROMPTS = st.builds(
    lambda group, branch, tail: [group] * 8 + [branch] * 4 + [tail] * tail,
    st.integers(1, 3),
    st.integers(1, 2),
    st.integers(0, 6),
)


class FootprintMachine(RuleBasedStateMachine):
    """Random lifecycles through `Admission`; the footprint must equal a recount from the tree."""

    def __init__(self):
        super().__init__()
        self.adm, _ = make(
            Recorder(stop_new_groups=False), scope="pass", defer_uncached_prefix=False, concentrate=False
        )
        self.seeing = self.adm.stopper
        self.n = 0

    def ids(self, state):
        return sorted(
            r
            for r in (*self.adm.tree.waiting_ids(), *self.adm.tree.active_ids())
            if self.adm.tree.state(r) is state
        )

    @rule(prompt=PROMPTS)
    def enqueue(self, prompt):
        self.n += 1
        self.adm.enqueue(self.n, prompt)

    @rule(limit=st.integers(1, 3))
    def select(self, limit):
        self.adm.select(self.adm.num_active, max_requests=limit)

    @precondition(lambda self: self.adm.num_active)
    @rule(pick=st.integers(0, 100), how=st.sampled_from(["finish", "retract", "abort", "activate_waiting"]))
    def change(self, pick, how):
        active = self.ids(RequestState.ACTIVE)
        rid = active[pick % len(active)]
        if how == "finish":
            self.adm.finish(rid)
        elif how == "retract":
            self.adm.retract(rid)
        elif how == "abort":
            self.adm.abort(rid)
        else:
            waiting = self.ids(RequestState.WAITING)
            if waiting:
                self.adm.activate(waiting[pick % len(waiting)])

    @precondition(lambda self: self.adm.num_waiting)
    @rule(pick=st.integers(0, 100), hint=st.integers(-1, 40))
    def activate_with_a_depth_hint(self, pick, hint):
        """The running depth a candidate reports is only a hint to the footprint: a stale one is ignored."""
        waiting = self.ids(RequestState.WAITING)
        self.adm._lifecycle.activate(self.adm.tree, waiting[pick % len(waiting)], depth_hint=hint)

    @precondition(lambda self: self.adm.num_waiting)
    @rule(pick=st.integers(0, 100), prompt=PROMPTS)
    def requeue_or_abort_waiting(self, pick, prompt):
        waiting = self.ids(RequestState.WAITING)
        rid = waiting[pick % len(waiting)]
        if pick % 2:
            self.adm.requeue(rid, prompt)
        else:
            self.adm.abort(rid)

    @rule(blind=st.booleans())
    def hand_over(self, blind):
        """Another stopper takes over: a blind one keeps no footprint, one that looks gets it recounted."""
        self.adm.stopper = make_policy("always") if blind else self.seeing

    @invariant()
    def footprint_matches_a_recount(self):
        tree, fp = self.adm.tree, self.adm.footprint
        if self.adm.stopper.blind_decision is not None:
            assert isinstance(fp, NoFootprint)
            return
        active = self.ids(RequestState.ACTIVE)
        groups = {}
        for rid in active:
            groups[tree.prefix_hash(rid)] = groups.get(tree.prefix_hash(rid), 0) + 1
        assert dict(fp.running) == groups
        chunks = {h for rid in active for h in tree.path_hashes(rid)}
        assert fp.num_running_chunks == len(chunks)
        assert fp.num_read_chunks == sum(len(tree.path_hashes(rid)) for rid in active)
        waiting = {}
        for rid in self.ids(RequestState.WAITING):
            waiting[tree.prefix_hash(rid)] = waiting.get(tree.prefix_hash(rid), 0) + 1
        assert dict(fp.waiting) == waiting


TestFootprint = FootprintMachine.TestCase
TestFootprint.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
