"""The reward window: the decode throughput that rewards a scheduling pass's stopper decisions."""

from __future__ import annotations

from collections.abc import Callable

from sglang_feather.admission.results import AdmissionStats
from sglang_feather.policy.base import DecisionRecord, StoppingPolicy

# How it works.
#
# The first stopper decision of a pass closes the open window, whose decode throughput rewards every decision
# made in it, and opens the next; `drained()` closes it without opening one, so idle time never dilutes a
# reward. Decode throughput is tokens of decode-only steps (`decode_step`) over the time those steps took: a
# step that computed prompt tokens (`prefill_step`) counts neither tokens nor time. The prefill is work that
# STOP does not avoid (the stopped request waits and is prefilled in a later pass), so charging it to the
# window that admitted it would make every ADD look slower than a STOP whose window is a bare decode step.


class RewardWindow:
    def __init__(self, stopper: StoppingPolicy, stats: AdmissionStats, clock: Callable[[], float]) -> None:
        self.stopper = stopper
        self.stats = stats
        self.clock = clock
        self._records: list[DecisionRecord] = []
        self._open = False
        self._num_tokens = 0
        self._decode_s = 0.0
        self._last_event_s: float | None = None
        """When the last step report (or the window's opening) happened: a step's duration is measured from it."""

    @property
    def num_records(self) -> int:
        return len(self._records)

    def hand_over(self, stopper: StoppingPolicy) -> None:
        """`stopper` decides and is rewarded from now on, for the decisions still open too."""
        self.stopper = stopper

    def record(self, record: DecisionRecord) -> None:
        """A stopper decision awaiting this window's reward."""
        self._records.append(record)

    def roll(self) -> None:
        """At a pass's first stopper decision: reward the open window if it decoded anything, open the next."""
        if not self._open or self._close():
            self._open = True
            self._num_tokens = 0
            self._decode_s = 0.0
            self._last_event_s = self.clock()

    def decode_step(self, num_tokens: int) -> float:
        """A decode step's tokens; returns its time (0 when no step report or window opening preceded it)."""
        elapsed = self._step_elapsed()
        if self._open:
            self._num_tokens += num_tokens
            self._decode_s += elapsed
        return elapsed

    def prefill_step(self) -> None:
        self._last_event_s = self.clock()  # `_step_elapsed`, whose result a prefill step does not count

    def drained(self) -> None:
        """Nothing runs any more: reward the open window and open none until the next decision."""
        self._close()
        self._open = False
        self._last_event_s = None

    def end(self, num_tokens: int, elapsed_s: float) -> float | None:
        """Reward every decision recorded since the last window with `num_tokens / elapsed_s` (normalised); a
        window without decisions still updates the normalisation. None for an empty window."""
        if elapsed_s <= 0 or num_tokens <= 0:
            return None
        records, self._records = self._records, []
        reward = self.stopper.feedback(records, num_tokens / elapsed_s)
        self.stats.num_windows += 1
        self.stats.last_reward = reward
        self.stats.sum_reward += reward
        return reward

    def _step_elapsed(self) -> float:
        now = self.clock()
        elapsed = 0.0 if self._last_event_s is None else max(0.0, now - self._last_event_s)
        self._last_event_s = now
        return elapsed

    def _close(self) -> bool:
        if not self._open or self._num_tokens == 0:
            return False
        self.end(self._num_tokens, self._decode_s)
        self._num_tokens = 0
        self._decode_s = 0.0
        return True
