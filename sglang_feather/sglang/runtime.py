"""Per-scheduler Feather state: the shared admission component, the queue mirror, reward windows, metrics."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sglang_feather.admission import Admission
from sglang_feather.policy.base import Decision
from sglang_feather.sglang.metrics import FeatherMetrics
from sglang_feather.sglang.mirror import QueueMirror
from sglang_feather.sglang.options import FeatherOptions, options_to_config

SAVE_INTERVAL_S = 30.0
"""How often a learning stopper's state is written to `--feather-state-path` while serving."""

# How it works.
#
# SGLang calls `order()` from `SchedulePolicy.calc_priority` at the start of every prefill pass: the mirror
# reconciles the tree with the queue, and the queue is sorted best-first by `Admission.sort_key` (starved
# requests first, then fewest chunks missing from the running batch's working set, then earlier arrival). SGLang's
# admission loop then walks that list and calls the PrefillAdder; for each request Feather's adder asks
# `propose()` (the stopper's add/stop decision on that candidate), lets SGLang's budgets have the last
# word, and reports `accept()` or `decline()`. After an admission the working set grew, so `promote()`
# moves the tree's new best into the next slot of the list the loop is walking. The reward of a batch
# window is the decode throughput between two admission passes that decided something: `end_step()`
# counts decode tokens, and the first decision of the next pass closes the window (so does the running
# batch draining, so that idle time never dilutes a reward).


class FeatherRuntime:
    def __init__(
        self,
        options: FeatherOptions,
        metrics: FeatherMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options
        self.metrics = metrics
        self.clock = clock
        self.admission = Admission.from_config(options_to_config(options), clock=clock)
        self.mirror = QueueMirror(self.admission)
        self._queue: list[Any] | None = None
        self._decided_this_pass = False
        self._window_start: float | None = None
        self._window_tokens = 0
        self._pass_s = 0.0
        self._last_save = clock()
        self._saved_windows = 0

    @property
    def tree(self):
        return self.admission.tree

    # ------------------------------------------------------------ prefill pass

    def order(self, waiting_queue: list[Any], running: Iterable[Any]) -> None:
        """Reconcile the tree with SGLang's queues, then sort `waiting_queue` in place, best first."""
        t0 = time.perf_counter()
        self.mirror.sync(waiting_queue, running, complete=False)
        waiting_queue.sort(key=self._ranker())
        self._queue = waiting_queue
        self._decided_this_pass = False
        self.admission.begin_pass()
        self._pass_s += time.perf_counter() - t0

    def _ranker(self) -> Callable[[Any], tuple]:
        sort_key, mirror = self.admission.sort_key, self.mirror

        def rank(req: Any) -> tuple:
            return (0, *sort_key(req.rid)) if req.rid in mirror else (1,)

        return rank

    def propose(self, req: Any, batch_size: int):
        """The stopper's proposal for admitting `req`, or None when Feather does not track it as waiting."""
        if not self.admission.is_waiting(req.rid):
            return None
        t0 = time.perf_counter()
        if not self._decided_this_pass:
            self._decided_this_pass = True
            self._close_window()
        # SGLang's loop ran `req.init_next_round_input` just before: `prefix_len` is what the radix cache holds.
        proposal = self.admission.propose(
            batch_size, request_id=req.rid, cached_tokens=lambda _: req.prefix_len
        )
        self._pass_s += time.perf_counter() - t0
        return proposal

    @staticmethod
    def says_stop(proposal: Any) -> bool:
        return proposal.decision is Decision.STOP

    def accept(self, proposal: Any, req: Any) -> None:
        t0 = time.perf_counter()
        self.admission.accept(proposal)
        if self.metrics is not None:
            self.metrics.admitted(proposal.candidate.delta)
        self._promote_after(req)
        self._pass_s += time.perf_counter() - t0

    def decline(self, proposal: Any) -> None:
        self.admission.decline(proposal)
        if self.metrics is not None:
            self.metrics.stopped()

    def withdraw(self, proposal: Any) -> None:
        """SGLang's own budget refused the request the stopper would have added: no decision to learn from."""
        self.admission.withdraw(proposal)

    def _promote_after(self, req: Any) -> None:
        queue = self._queue
        best = self.tree.best()
        if queue is None or best is None or best.request_id not in self.mirror:
            return
        best_req = self.mirror.request(best.request_id)
        try:
            here = queue.index(req)
            there = queue.index(best_req, here + 1)
        except ValueError:
            return
        if there > here + 1 and not self._is_starved(queue[here + 1]):
            queue.insert(here + 1, queue.pop(there))

    def _is_starved(self, req: Any) -> bool:
        return self.admission.is_waiting(req.rid) and self.admission.guard.is_starved(
            self.admission.wait_s(req.rid)
        )

    # ------------------------------------------------------------ step end

    def end_step(self, waiting: Sequence[Any], active: Iterable[Any], decode_reqs: Sequence[Any]) -> None:
        """Called once per scheduler step with the complete picture; drops whatever has left."""
        self._queue = None
        self.mirror.sync(waiting, active, complete=True)
        if decode_reqs:
            if self._window_start is not None:
                self._window_tokens += len(decode_reqs)
            if self.metrics is not None:
                groups = {self.mirror.first_hash(req.rid) for req in decode_reqs}
                groups.discard(None)
                self.metrics.decode_batch(len(groups))
        if self.tree.num_active == 0:
            self._end_window()
            self._window_start = None
        if self.metrics is not None:
            self.metrics.tracked(self.tree.num_waiting, self.tree.num_active)
            if self._pass_s:
                self.metrics.scheduler_pass(self._pass_s)
        self._pass_s = 0.0
        self._maybe_save()

    def _maybe_save(self) -> None:
        """Persist learned state at most every SAVE_INTERVAL_S, and only after new rewards arrived."""
        now = self.clock()
        num_windows = self.admission.stats.num_windows
        if (
            self.options.state_path is not None
            and num_windows != self._saved_windows
            and now - self._last_save >= SAVE_INTERVAL_S
        ):
            self._last_save = now
            self._saved_windows = num_windows
            self.admission.save_state()

    def _close_window(self) -> None:
        """At a pass's first decision: reward the open window if it decoded anything, then open the next."""
        if self._window_start is None or self._end_window():
            self._window_start = self.clock()

    def _end_window(self) -> bool:
        if self._window_start is None or self._window_tokens == 0:
            return False
        self.admission.end_window(self._window_tokens, self.clock() - self._window_start)
        self._window_tokens = 0
        return True

    def close(self) -> None:
        """Forget every request and persist the learned state (when a state path is set)."""
        self.mirror.clear()
        if self.options.state_path is not None:
            self.admission.save_state()
