"""`bench step-model`: what the `step-model` stopper costs per decode step it is shown and per consult."""

from __future__ import annotations

import argparse
import os
import random
import time

from sglang_feather.bench.cli_types import add_json_flag, publish
from sglang_feather.bench.report import machine_line, run_meta
from sglang_feather.policy import Observation, StepSample, make_policy

# How it works.
#
# A fresh `step-model` is shown `--steps` random decode steps (batch, groups, distinct and per-request chunks
# drawn from a serving-like range), then asked `--consults` times about a candidate that adds a prefix group,
# with a step shown between consults, so every consult re-solves the fit, its most expensive case. Each phase
# is timed whole with `time.perf_counter` and reported per call, `--rounds` times; the median and range are
# given. Nothing here depends on an engine: it is the stopper's own CPU cost, what a decode step or a
# scheduling pass pays on top of the engine.


def _step(rng: random.Random) -> StepSample:
    batch, groups = rng.randint(1, 512), rng.randint(1, 64)
    return StepSample(batch, rng.uniform(0.005, 0.2), groups, rng.randint(0, 8192), rng.randint(0, 65536))


def _consult(rng: random.Random) -> Observation:
    batch, groups = rng.randint(1, 512), rng.randint(1, 64)
    return Observation(
        batch_size=batch,
        depth_before=0,
        depth_after=0,
        num_sharing=0,
        num_waiting=8,
        wait_s=0.0,
        adds_group=True,
        num_groups_running=groups,
        num_running_chunks=groups * 64,
        num_new_chunks=64,
        num_group_waiting=rng.randint(0, 16),
        num_read_chunks=batch * 64,
        num_chunks=64,
    )


def run(num_steps: int, num_consults: int, rounds: int, seed: int = 0) -> dict:
    started, load_before = time.time(), os.getloadavg()
    step_us, consult_us = [], []
    for r in range(rounds):
        rng = random.Random(seed + r)
        policy = make_policy("step-model")
        steps = [_step(rng) for _ in range(num_steps)]
        t0 = time.perf_counter()
        for step in steps:
            policy.observe_step(step)
        step_us.append((time.perf_counter() - t0) / num_steps * 1e6)
        pairs = [(_step(rng), _consult(rng)) for _ in range(num_consults)]
        t0 = time.perf_counter()
        for step, obs in pairs:
            policy.observe_step(step)
            policy.decide(obs)
        consult_us.append((time.perf_counter() - t0) / num_consults * 1e6)
    meta = {**run_meta(started, load_before, engines={}), "steps": num_steps, "consults": num_consults}
    return {"meta": meta, "step_us": step_us, "consult_us": consult_us}


def _spread(values: list[float]) -> str:
    ordered = sorted(values)
    return f"{ordered[len(ordered) // 2]:.1f} [{ordered[0]:.1f}–{ordered[-1]:.1f}]"


def markdown(result: dict) -> str:
    meta = result["meta"]
    return "\n".join(
        [
            f"{machine_line(meta)}; {meta['steps']} steps and {meta['consults']} consults a round, "
            f"{len(result['step_us'])} rounds; median [range] µs per call.",
            "",
            "| call | µs |",
            "|---|---|",
            f"| `observe_step` (fit update) | {_spread(result['step_us'])} |",
            f"| `observe_step` + `decide` (re-solve, leverage, two predictions) | {_spread(result['consult_us'])} |",
        ]
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=20000, help="decode steps shown a round")
    parser.add_argument("--consults", type=int, default=2000, help="consults a round, a step before each")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    add_json_flag(parser)


def main(args: argparse.Namespace) -> int:
    result = run(args.steps, args.consults, args.rounds, args.seed)
    return publish(markdown(result), result, args.json)
