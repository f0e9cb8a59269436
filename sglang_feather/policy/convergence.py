"""Regret and convergence of the stopping policies on the synthetic environments: table + PNG."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sglang_feather.policy.registry import POLICIES, learning_policy_names, make_policy
from sglang_feather.policy.synthetic import GroupedWorkload, greedy_score, train

ENVIRONMENTS: dict[str, GroupedWorkload] = {
    "grouped": GroupedWorkload(),
    "homogeneous": GroupedWorkload(small_batch=4, max_good_delta=0),
}
"""`grouped`: add iff batch < 8 or Δ <= 2; `homogeneous`: add iff batch < 4 (any mismatch hurts after)."""

RUNS: dict[str, tuple[str, dict[str, float]]] = {
    **{name: (name, {}) for name in POLICIES},
    "ucb c=0.1": ("ucb", {"exploration": 0.1}),
    "ucb c=0.25": ("ucb", {"exploration": 0.25}),
    "ucb c=1.41": ("ucb", {"exploration": 1.41}),
    "qlearn λ=0": ("qlearn", {"trace": 0.0}),
    "qlearn λ=0.5": ("qlearn", {"trace": 0.5}),
}
"""Every stopper of the registry at its defaults, then variants of the learners' options."""
PLOTTED = tuple(POLICIES)


@dataclass(frozen=True)
class RunResult:
    label: str
    env: str
    cumulative: np.ndarray
    """(seeds, episodes) cumulative regret."""
    optimal_share: np.ndarray
    """(seeds, episodes) share of learnable decisions matching the optimum (NaN where none)."""
    greedy_match: np.ndarray
    """(seeds,) share of optimal decisions of the final greedy rule on fresh episodes."""


def run(label: str, env_name: str, num_episodes: int, seeds: Sequence[int]) -> RunResult:
    name, options = RUNS[label]
    env = ENVIRONMENTS[env_name]
    cumulative, share, greedy = [], [], []
    for seed in seeds:
        policy = make_policy(name, seed=seed, **options)
        training = train(policy, env, num_episodes, seed)
        cumulative.append(np.cumsum(training.regrets))
        share.append(training.optimal_share)
        greedy.append(greedy_score(policy, env, 500, 10_000 + seed)[0])
    return RunResult(label, env_name, np.array(cumulative), np.array(share), np.array(greedy))


def table(results: Sequence[RunResult], num_episodes: int) -> str:
    marks = [m for m in (500, 1000, 2000, 4000, 8000, 16000) if m < num_episodes] + [num_episodes]
    half = num_episodes // 2
    head = ["env", "policy"] + [f"R({m})" for m in marks] + ["R2/R1", "greedy opt%"]
    rows = [head]
    for r in results:
        mean = r.cumulative.mean(axis=0)
        second_half = (r.cumulative[:, -1] - r.cumulative[:, half - 1]).mean()
        ratio = second_half / max(r.cumulative[:, half - 1].mean(), 1e-12)
        rows.append(
            [r.env, r.label]
            + [f"{mean[m - 1]:.1f}" for m in marks]
            + [f"{ratio:.2f}", f"{100 * r.greedy_match.mean():.1f}"]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


def plot(results: Sequence[RunResult], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(r.env for r in results))
    fig, axes = plt.subplots(2, len(envs), figsize=(6 * len(envs), 7.5), squeeze=False)
    window = max(1, min(250, results[0].cumulative.shape[1] // 10))
    for col, env in enumerate(envs):
        learners = [
            r.cumulative.max() for r in results if r.env == env and r.label in learning_policy_names()
        ]
        for r in results:
            if r.env != env or r.label not in PLOTTED:
                continue
            x = np.arange(1, r.cumulative.shape[1] + 1)
            mean = r.cumulative.mean(axis=0)
            (line,) = axes[0, col].plot(x, mean, label=f"{r.label} (final {mean[-1]:.0f})")
            axes[0, col].fill_between(x, r.cumulative.min(axis=0), r.cumulative.max(axis=0), alpha=0.2)
            share = np.nanmean(r.optimal_share, axis=0)
            share = np.where(np.isnan(share), 1.0, share)
            rolling = np.convolve(share, np.ones(window) / window, mode="valid")
            axes[1, col].plot(x[window - 1 :], rolling, color=line.get_color(), label=r.label)
        axes[0, col].set_title(f"{env}: cumulative regret (mean, min-max over seeds)")
        axes[0, col].set_xlabel("episode (one pass + its window)")
        axes[0, col].set_ylabel("regret vs. optimal rule")
        if learners:
            axes[0, col].set_ylim(0, 1.5 * max(learners))
        axes[1, col].set_title(f"{env}: decisions equal to the optimum (rolling {window})")
        axes[1, col].set_xlabel("episode")
        axes[1, col].set_ylim(0.0, 1.01)
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=8000)
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1")
    parser.add_argument("--out", type=Path, help="write the PNG here (needs matplotlib)")
    parser.add_argument("--runs", nargs="*", choices=list(RUNS), default=list(RUNS))
    args = parser.parse_args(argv)
    if args.episodes < 2 or args.seeds < 1:
        parser.error("--episodes must be >= 2 and --seeds >= 1")
    start = time.perf_counter()
    seeds = range(args.seeds)
    results = [run(label, env, args.episodes, seeds) for env in ENVIRONMENTS for label in args.runs]
    print(f"{args.episodes} episodes x {args.seeds} seeds; R(n) = mean cumulative regret after n episodes;")
    print("R2/R1 = regret in the second half / first half (sublinear: < 1); greedy opt% = final rule's")
    print("share of optimal decisions on 500 fresh episodes per seed\n")
    print(table(results, args.episodes))
    if args.out is not None:
        plot(results, args.out)
        print(f"\nwrote {args.out}")
    print(f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
