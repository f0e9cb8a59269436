"""The overhead benchmark's goals per CHT backend, and the tables that check a run against them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sglang_feather.bench.markdown import header, ms, ratio, row, us

TARGET_PROMPT_LEN = 10240
TARGET_QUEUE_SIZE = 2000


def _amortised(cell: dict, op: str) -> float:
    seq = cell["sequence"]["cht"]
    return seq[f"{op}_s"] / max(seq[f"num_{op}"], 1)


def _is_long(cell: dict) -> bool:
    return cell["prompt_len"] == TARGET_PROMPT_LEN


def _is_big(cell: dict) -> bool:
    return cell["num_waiting"] == TARGET_QUEUE_SIZE


@dataclass(frozen=True)
class TargetSpec:
    name: str
    goal: float
    is_ratio: bool
    """Ratios must reach `goal` (SGLang / CHT); times (seconds) must stay below it."""
    value: Callable[[dict], float]
    applies: Callable[[dict], bool]


TARGETS = (
    TargetSpec(
        "insert of a 10K-token prompt", 100e-6, False, lambda c: c["cht"]["insert_s"]["median_s"], _is_long
    ),
    TargetSpec("best()", 5e-6, False, lambda c: c["cht"]["best_s"]["median_s"], lambda c: True),
    TargetSpec("activate amortised, W=2000", 50e-6, False, lambda c: _amortised(c, "activate"), _is_big),
    TargetSpec("finish amortised, W=2000", 50e-6, False, lambda c: _amortised(c, "finish"), _is_big),
    TargetSpec(
        "pass (k) vs dfs-weight, W=2000 x 10K",
        1000,
        True,
        lambda c: c["pass_ratio"]["dfs-weight"],
        lambda c: _is_big(c) and _is_long(c),
    ),
    TargetSpec(
        "pass (budget k) vs dfs-weight, W=2000 x 10K",
        1000,
        True,
        lambda c: c["budget_pass_ratio"]["dfs-weight"],
        lambda c: _is_big(c) and _is_long(c),
    ),
    TargetSpec(
        "sequence vs dfs-weight", 100, True, lambda c: c["sequence"]["ratio"]["dfs-weight"], lambda c: True
    ),
)


NATIVE_TARGETS = (
    TargetSpec(
        "insert of a 10K-token prompt (hash incl.)",
        30e-6,
        False,
        lambda c: c["cht"]["insert_s"]["median_s"],
        _is_long,
    ),
    TargetSpec("best()", 1e-6, False, lambda c: c["cht"]["best_s"]["median_s"], lambda c: True),
    TargetSpec("activate amortised, W=2000", 5e-6, False, lambda c: _amortised(c, "activate"), _is_big),
    TargetSpec("finish amortised, W=2000", 5e-6, False, lambda c: _amortised(c, "finish"), _is_big),
    TargetSpec(
        "whole run vs dfs-weight, shared W=2000 x 10K",
        100,
        True,
        lambda c: c["sequence"]["ratio"]["dfs-weight"],
        lambda c: _is_big(c) and _is_long(c) and c["workload"] == "shared",
    ),
)
"""GitHub issue 12's goals for the compiled tree; `TARGETS` are the original (Python tree) goals."""

BACKEND_TARGETS = {"python": TARGETS, "native": NATIVE_TARGETS}


def backend_view(cell: dict, backend: str) -> dict:
    """The cell as if `backend` were the only CHT measured (the shape `TARGETS` read)."""
    data = cell["backends"][backend]
    sequence = {**cell["sequence"], "cht": data["sequence"], "ratio": data["sequence_ratio"]}
    return {
        **cell,
        "cht": data["cht"],
        "pass_ratio": data["pass_ratio"],
        "budget_pass_ratio": data["budget_pass_ratio"],
        "sequence": sequence,
    }


def backends_table(result: dict) -> list[str]:
    """Every backend side by side on every cell (ratios are SGLang dfs-weight / that backend, one run)."""
    lines = header(
        [
            "workload",
            "W",
            "prompt",
            "backend",
            "insert µs",
            "best µs",
            "activate µs/op (run)",
            "finish µs/op (run)",
            "pass: dfs-weight / CHT",
            "budget pass: dfs-weight / CHT",
            "whole run ms",
            "whole run: dfs-weight / CHT",
        ],
        num_left=4,
    )
    for c in result["cells"]:
        for backend in c.get("backends", {}):
            view = backend_view(c, backend)
            cht, seq = view["cht"], view["sequence"]["cht"]
            lines.append(
                row(
                    [c["workload"], str(c["num_waiting"]), str(c["prompt_len"]), backend]
                    + [us(cht["insert_s"]["median_s"]), us(cht["best_s"]["median_s"])]
                    + [us(_amortised(view, "activate")), us(_amortised(view, "finish"))]
                    + [
                        ratio(view["pass_ratio"]["dfs-weight"]),
                        ratio(view["budget_pass_ratio"]["dfs-weight"]),
                    ]
                    + [ms(seq["total_s"]), ratio(view["sequence"]["ratio"]["dfs-weight"])]
                )
            )
    return lines


def _show(spec: TargetSpec, value: float) -> str:
    return ratio(value) if spec.is_ratio else f"{us(value)} µs"


def target_table(result: dict, backend: str | None = None) -> list[str]:
    """Each target against the worst cell it applies to (figures, not pass/fail tests); `backend` picks the
    backend and its goals (default: the default backend's figures against `TARGETS`)."""
    lines = header(["target", "goal", "worst cell", "measured", "met"], num_left=3)
    specs = TARGETS if backend is None else BACKEND_TARGETS[backend]
    all_cells = result["cells"] if backend is None else [backend_view(c, backend) for c in result["cells"]]
    for spec in specs:
        cells = [c for c in all_cells if spec.applies(c)]
        goal = ("≥ " if spec.is_ratio else "≤ ") + _show(spec, spec.goal)
        if not cells:
            lines.append(row([spec.name, goal, "no such cell in this run", "", "n/a"]))
            continue
        pick = min if spec.is_ratio else max
        worst = pick(cells, key=spec.value)
        value = spec.value(worst)
        met = value >= spec.goal if spec.is_ratio else value <= spec.goal
        where = f"{worst['workload']} {worst['num_waiting']}×{worst['prompt_len']}"
        lines.append(row([spec.name, goal, where, _show(spec, value), "yes" if met else "NO"]))
    return lines
