"""The admission shows a stopper that observes steps every decode step with the running batch's footprint."""

from sglang_feather.admission import Admission, AdmissionConfig
from sglang_feather.policy import Decision, Observation, StepSample, make_policy
from sglang_feather.policy.base import PolicyBase
from sglang_feather.sim.engine import SimClock

GROUP_A = [1] * 32
GROUP_B = [2] * 32


class StepRecorder(PolicyBase):
    """Adds everything and keeps every step it is shown."""

    name = "step-recorder"
    observes_steps = True

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[StepSample] = []

    def decide(self, obs: Observation) -> Decision:
        return Decision.ADD

    def observe_step(self, step: StepSample) -> None:
        self.steps.append(step)


def make(stopper):
    clock = SimClock()
    adm = Admission.from_config(AdmissionConfig(chunk_size=4, defer_uncached_prefix=False), clock=clock)
    adm.stopper = stopper
    return adm, clock


def test_each_decode_step_is_shown_with_its_time_and_the_batch_it_read():
    rec = StepRecorder()
    adm, clock = make(rec)
    adm.enqueue("a0", GROUP_A + [5])
    adm.enqueue("a1", GROUP_A + [6])
    adm.enqueue("b0", GROUP_B + [5])
    assert len(adm.select(0).admitted) == 3
    clock.now += 0.5
    adm.on_prefill_step()
    clock.now += 0.02
    adm.on_decode_step(3)
    assert rec.steps == [
        StepSample(
            num_tokens=3,
            elapsed_s=rec.steps[0].elapsed_s,
            num_groups=2,
            num_running_chunks=19,
            num_read_chunks=27,
        )
    ], "a0 and a1 share 8 of their 9 chunks, b0 shares none: 19 distinct, 27 counted per request"
    assert abs(rec.steps[0].elapsed_s - 0.02) < 1e-12, "a step's time runs from the previous step report"
    adm.finish("b0")
    clock.now += 0.01
    adm.on_decode_step(2)
    assert (rec.steps[-1].num_groups, rec.steps[-1].num_running_chunks, rec.steps[-1].num_read_chunks) == (
        1,
        10,
        18,
    )


def test_a_step_without_a_measured_time_is_not_shown():
    rec = StepRecorder()
    adm, clock = make(rec)
    adm.enqueue("a0", GROUP_A + [5])
    adm.select(0)
    adm.on_batch_drained()  # no step report or window opening since: the next step has no start time
    clock.now += 0.02
    adm.on_decode_step(1)
    assert rec.steps == []


def test_a_stopper_that_does_not_observe_steps_is_not_shown_any():
    rec = StepRecorder()
    rec.observes_steps = False
    adm, clock = make(rec)
    adm.enqueue("a0", GROUP_A + [5])
    adm.select(0)
    clock.now += 0.02
    adm.on_decode_step(1)
    assert rec.steps == []


def test_the_step_model_stopper_learns_from_the_admissions_reports():
    adm, clock = make(make_policy("step-model"))
    adm.enqueue("a0", GROUP_A + [5])
    adm.select(0)
    for _ in range(5):
        clock.now += 0.02
        adm.on_decode_step(1)
    assert adm.stopper.model.num_samples == 5
