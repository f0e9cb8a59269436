"""Stoppers on a synthetic workload whose optimal rule flips at known episodes: regret and time to adapt."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sglang_feather.policy.context import is_forced
from sglang_feather.policy.registry import make_policy
from sglang_feather.policy.synthetic import GroupedWorkload, draw_episode, play

# How it works.
#
# A piecewise-stationary environment is a sequence of phases, each a `GroupedWorkload` (whose optimal rule
# is known and optimal in hindsight) played for a number of episodes; the policy learns throughout and is
# never told where a phase starts. Regret is measured per episode against the *current* phase's optimal
# rule (the per-phase oracle). After each shift, the decisions to adapt are the learnable decisions (not
# forced) from the shift until the first window of `ADAPT_WINDOW` learnable decisions in which at least
# `ADAPT_SHARE` match the new phase's optimum; None when that never happens within the phase.

PHASES: tuple[tuple[str, GroupedWorkload, int], ...] = (
    ("grouped", GroupedWorkload(), 3000),
    ("homogeneous", GroupedWorkload(small_batch=4, max_good_delta=0), 3000),
    ("lenient", GroupedWorkload(small_batch=16, max_good_delta=4), 3000),
)
"""grouped: add iff batch < 8 or Δ <= 2 (convergence.py's); homogeneous: add iff batch < 4; lenient: add iff
batch < 16 or Δ <= 4 (every boundary falls on a context bucket's edge: batches by 4, Δ clamped at 5, so the
optimum is a rule over contexts). grouped -> homogeneous turns ADD into STOP for batches 4-7 and for Δ 1-2 at
batch >= 8; homogeneous -> lenient turns STOP back into ADD for batches 4-15 and for Δ 1-4 beyond. 3,000 episodes a phase
is more than `ucb` needs to converge from scratch on either stationary environment (docs/policy.md)."""

ADAPT_WINDOW = 200
"""Learnable decisions per window when judging adaptation (about 100 episodes)."""
ADAPT_SHARE = 0.9
"""Share of a window's decisions that must match the new optimum (stationary `ucb` reaches 0.94-1.0)."""


@dataclass(frozen=True)
class Run:
    """A stopper and its options; `told_shifts` gives it a fresh policy at every phase start (it is told
    where the shifts are), the reference for how fast a learner from scratch adapts."""

    policy: str
    options: Mapping[str, float] = field(default_factory=dict)
    told_shifts: bool = False


RUNS: dict[str, Run] = {
    "always": Run("always"),
    "static": Run("static"),
    "ucb": Run("ucb"),
    "ucb, restarted at each shift (told)": Run("ucb", told_shifts=True),
    "ucb-adaptive": Run("ucb-adaptive"),
    "ucb-adaptive no detector": Run("ucb-adaptive", {"detector_threshold": 1e9}),
    "ucb-adaptive γ=1": Run("ucb-adaptive", {"discount": 1.0}),
    "ucb-adaptive γ=0.99": Run("ucb-adaptive", {"discount": 0.99}),
    "ucb-adaptive λ=1": Run("ucb-adaptive", {"detector_threshold": 1.0}),
    "ucb-adaptive λ=3": Run("ucb-adaptive", {"detector_threshold": 3.0}),
}


@dataclass(frozen=True)
class ShiftRun:
    label: str
    seed: int
    regrets: np.ndarray
    """Per-episode regret against the current phase's optimal rule."""
    matches: tuple[np.ndarray, ...]
    """Per phase: 1/0 per learnable decision, whether it matched that phase's optimum, in order."""

    def phase_regret(self, phase: int) -> float:
        starts = np.cumsum([0] + [n for _, _, n in PHASES])
        return float(self.regrets[starts[phase] : starts[phase + 1]].sum())

    def decisions_to_adapt(self, phase: int) -> int | None:
        """Learnable decisions from the start of `phase` until a window of them is mostly optimal."""
        return decisions_to_adapt(self.matches[phase])


def decisions_to_adapt(
    matches: np.ndarray, window: int = ADAPT_WINDOW, share: float = ADAPT_SHARE
) -> int | None:
    """The first index i such that matches[i:i + window] has a mean >= share; None if there is none."""
    if len(matches) < window:
        return None
    sums = np.convolve(matches, np.ones(window), mode="valid")
    good = np.flatnonzero(sums >= share * window)
    return int(good[0]) if len(good) else None


def run_shifts(
    label: str, seed: int, phases: Sequence[tuple[str, GroupedWorkload, int]] = PHASES
) -> ShiftRun:
    run = RUNS[label]
    policy = make_policy(run.policy, seed=seed, **run.options)
    rng = np.random.default_rng(seed)
    regrets: list[float] = []
    matches: list[np.ndarray] = []
    for _, env, num_episodes in phases:
        if run.told_shifts:
            policy = make_policy(run.policy, seed=seed, **run.options)
        flags: list[int] = []
        for _ in range(num_episodes):
            outcome = play(policy, env, draw_episode(env, rng), rng)
            regrets.append(outcome.regret)
            flags += [
                int(r.decision is env.optimal(r.observation))
                for r in outcome.records
                if not is_forced(r.observation)
            ]
        matches.append(np.array(flags, dtype=float))
    return ShiftRun(label, seed, np.array(regrets), tuple(matches))


def table(runs: Sequence[ShiftRun]) -> str:
    """Per policy (median [min-max] over seeds): regret per phase and in all, decisions to adapt per shift."""
    names = [p for p, _, _ in PHASES]
    head = ["policy", *(f"R {p}" for p in names), "R total"]
    head += [f"adapt -> {p}" for p in names[1:]] + ["adapt from scratch"]
    rows = [head]
    for label in dict.fromkeys(r.label for r in runs):
        mine = [r for r in runs if r.label == label]
        cells = [label]
        for k in range(len(PHASES)):
            cells.append(_spread([r.phase_regret(k) for r in mine], "{:.0f}"))
        cells.append(_spread([float(r.regrets.sum()) for r in mine], "{:.0f}"))
        for k in [*range(1, len(PHASES)), 0]:
            cells.append(_adapt([r.decisions_to_adapt(k) for r in mine]))
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _spread(values: list[float], fmt: str) -> str:
    med, low, high = (fmt.format(v) for v in (np.median(values), min(values), max(values)))
    return med if low == high else f"{med} [{low}-{high}]"


def _adapt(values: list[int | None]) -> str:
    """Median [min-max] of the decisions to adapt; 'never' counts as infinite, shown as 'never'."""
    keyed = sorted(values, key=lambda v: float("inf") if v is None else v)
    shown = ["never" if v is None else str(v) for v in keyed]
    median = shown[(len(shown) - 1) // 2]
    return median if shown[0] == shown[-1] else f"{median} [{shown[0]}-{shown[-1]}]"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1")
    parser.add_argument("--runs", nargs="*", choices=list(RUNS), default=list(RUNS))
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    start = time.perf_counter()
    runs = [run_shifts(label, seed) for label in args.runs for seed in range(args.seeds)]
    phases = ", ".join(f"{name} x {n}" for name, _, n in PHASES)
    print(f"phases: {phases} episodes; {args.seeds} seeds, median [min-max]")
    print("R = cumulative regret against the current phase's optimal rule (one unit = one episode's value)")
    print(
        f"adapt = learnable decisions after the shift until {ADAPT_SHARE:.0%} of a window of {ADAPT_WINDOW} "
        "match the new optimum\n"
    )
    print(table(runs))
    print(f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
