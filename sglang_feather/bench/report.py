"""Overhead results as JSON-ready dicts and the markdown tables printed from them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sglang_feather.bench.cht_side import ChtCell, ChtSequence

TARGET_PROMPT_LEN = 10240
TARGET_QUEUE_SIZE = 2000


@dataclass(frozen=True)
class Cell:
    workload: str
    num_waiting: int
    prompt_len: int
    budget_k: int
    """Requests one SGLang pass admits under its default prefill token budget."""
    policies: dict[str, Any]
    """Policy name -> the baseline's `PolicyTiming`."""
    cht: ChtCell
    sequences: dict[str, tuple[Any, int]]
    """Policy name -> the baseline's median `SequenceTiming` and the number of runs it is the median of."""
    cht_sequence: tuple[ChtSequence, int]
    sequence_k: int
    """Requests each pass of the sequences admitted."""
    cores: dict[str, tuple[ChtCell, tuple[ChtSequence, int]]] = field(default_factory=dict)
    """Every CHT core measured (name -> cell and sequence); `cht`/`cht_sequence` are the default core's."""
    prompt_read_s: float | None = None
    """Reading every queued prompt once with no hashing (`cht_side.prompt_read_s`); None without the compiled
    core."""

    def core_json(self, cht: ChtCell, cht_sequence: tuple[ChtSequence, int]) -> dict:
        """One core's figures and its ratios against every SGLang policy."""
        sequence, num_runs = cht_sequence
        return {
            "cht": cht_json(cht),
            "pass_ratio": {n: t.samples.median_s / cht.pass_s.median_s for n, t in self.policies.items()},
            "budget_pass_ratio": {
                n: t.samples.median_s / cht.passes[self.budget_k].median_s for n, t in self.policies.items()
            },
            "sequence": {**asdict(sequence), "num_runs": num_runs},
            "sequence_ratio": {n: s.total_s / sequence.total_s for n, (s, _) in self.sequences.items()},
        }

    def to_json(self, num_per_pass: int) -> dict:
        cht_pass = self.cht.pass_s.median_s
        budget_pass = self.cht.passes[self.budget_k].median_s
        cht_sequence, cht_runs = self.cht_sequence
        return {
            "workload": self.workload,
            "num_waiting": self.num_waiting,
            "prompt_len": self.prompt_len,
            "budget_k": self.budget_k,
            "sglang": {
                name: {
                    "active_policy": t.active_policy,
                    **asdict(t.samples),
                    "head": list(t.order[:num_per_pass]),
                }
                for name, t in self.policies.items()
            },
            "cht": cht_json(self.cht),
            "pass_ratio": {name: t.samples.median_s / cht_pass for name, t in self.policies.items()},
            "budget_pass_ratio": {
                name: t.samples.median_s / budget_pass for name, t in self.policies.items()
            },
            "sequence": {
                "num_per_pass": self.sequence_k,
                "sglang": {name: {**asdict(s), "num_runs": n} for name, (s, n) in self.sequences.items()},
                "cht": {**asdict(cht_sequence), "num_runs": cht_runs},
                "ratio": {name: s.total_s / cht_sequence.total_s for name, (s, _) in self.sequences.items()},
            },
            "cores": {name: self.core_json(*measured) for name, measured in self.cores.items()},
            "prompt_read_s": self.prompt_read_s,
        }


def cht_json(cell: ChtCell) -> dict:
    """`asdict`, with the per-k pass costs keyed by str(k) as JSON will have them."""
    data = asdict(cell)
    data["passes"] = {str(k): v for k, v in data["passes"].items()}
    return data


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}" if seconds >= 1e-3 else f"{seconds * 1e3:.4f}"


def _ratio(value: float) -> str:
    return f"{value:,.0f}×" if value >= 10 else f"{value:.1f}×"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _header(names: list[str], num_left: int = 1) -> list[str]:
    """A markdown header; the first `num_left` columns align left, the (numeric) rest right."""
    return [_row(names), "|" + "---|" * num_left + "---:|" * (len(names) - num_left)]


def _policy_cell(policy: str, entry: dict) -> str:
    if entry["active_policy"] != policy:
        return f"→{entry['active_policy']} {_ms(entry['median_s'])}"
    return _ms(entry["median_s"])


def _ratio_cell(policy: str, entry: dict, ratio: float) -> str:
    return f"({entry['active_policy']})" if entry["active_policy"] != policy else _ratio(ratio)


def pass_table(result: dict) -> list[str]:
    k = result["meta"]["config"]["plan"]["num_per_pass"]
    policies = list(result["cells"][0]["sglang"])
    lines = _header(
        ["workload", "W", "prompt"]
        + [f"SGLang {p} ms" for p in policies]
        + [f"CHT µs, k={k}"]
        + [f"{p} / CHT" for p in policies]
        + ["budget k", "CHT µs, budget k", "dfs-weight / CHT, budget k"]
    )
    for c in result["cells"]:
        budget_k = c["budget_k"]
        lines.append(
            _row(
                [c["workload"], str(c["num_waiting"]), str(c["prompt_len"])]
                + [_policy_cell(p, c["sglang"][p]) for p in policies]
                + [_us(c["cht"]["pass_s"]["median_s"])]
                + [_ratio_cell(p, c["sglang"][p], c["pass_ratio"][p]) for p in policies]
                + [str(budget_k), _us(c["cht"]["passes"][str(budget_k)]["median_s"])]
                + [_ratio(c["budget_pass_ratio"]["dfs-weight"])]
            )
        )
    return lines


def op_table(result: dict) -> list[str]:
    lines = _header(
        [
            "workload",
            "W",
            "prompt",
            "insert µs (hash incl.)",
            "hash only µs",
            "best µs",
            "activate µs",
            "finish µs",
        ]
    )
    for c in result["cells"]:
        cht = c["cht"]
        lines.append(
            _row(
                [c["workload"], str(c["num_waiting"]), str(c["prompt_len"])]
                + [
                    _us(cht[k]["median_s"])
                    for k in ("insert_s", "hash_s", "best_s", "activate_s", "finish_s")
                ]
            )
        )
    return lines


def sequence_table(result: dict) -> list[str]:
    policies = list(result["cells"][0]["sglang"])
    lines = _header(
        ["workload", "W", "prompt", "k", "passes"]
        + [f"SGLang {p} ms" for p in policies]
        + ["CHT ms (insert + best + activate + finish)", "CHT activate µs/op", "CHT finish µs/op"]
        + [f"{p} / CHT" for p in policies],
    )
    for c in result["cells"]:
        seq = c["sequence"]
        cht = seq["cht"]
        parts = " + ".join(_ms(cht[k]) for k in ("insert_s", "best_s", "activate_s", "finish_s"))
        sglang = []
        for p in policies:
            s = seq["sglang"][p]
            fcfs = f" ({s['num_fcfs_passes']}/{s['num_passes']} →fcfs)" if s["num_fcfs_passes"] else ""
            sglang.append(_ms(s["total_s"]) + fcfs)
        lines.append(
            _row(
                [c["workload"], str(c["num_waiting"]), str(c["prompt_len"]), str(seq["num_per_pass"])]
                + [str(cht["num_passes"])]
                + sglang
                + [
                    f"{_ms(cht['total_s'])} = {parts}",
                    _us(cht["activate_s"] / max(cht["num_activate"], 1)),
                    _us(cht["finish_s"] / max(cht["num_finish"], 1)),
                ]
                + [_ratio(seq["ratio"][p]) for p in policies]
            )
        )
    return lines


def read_table(result: dict) -> list[str]:
    """The floor under every insert: reading the queued prompts once, against the whole runs."""
    policies = list(result["cells"][0]["sglang"])
    lines = _header(
        ["workload", "W", "prompt", "read every prompt once ms", "CHT inserts / read"]
        + [f"{p} whole run / read (no core's ratio can pass this)" for p in policies]
    )
    for c in result["cells"]:
        read_s = c.get("prompt_read_s")
        if read_s is None:
            continue
        seq = c["sequence"]
        lines.append(
            _row(
                [c["workload"], str(c["num_waiting"]), str(c["prompt_len"]), _ms(read_s)]
                + [f"{seq['cht']['insert_s'] / read_s:.1f}×"]
                + [_ratio(seq["sglang"][p]["total_s"] / read_s) for p in policies]
            )
        )
    return lines


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
"""GitHub issue 12's goals for the compiled core; `TARGETS` are the original (Python core) goals."""

CORE_TARGETS = {"python": TARGETS, "native": NATIVE_TARGETS}


def core_view(cell: dict, core: str) -> dict:
    """The cell as if `core` were the only CHT measured (the shape `TARGETS` read)."""
    data = cell["cores"][core]
    sequence = {**cell["sequence"], "cht": data["sequence"], "ratio": data["sequence_ratio"]}
    return {
        **cell,
        "cht": data["cht"],
        "pass_ratio": data["pass_ratio"],
        "budget_pass_ratio": data["budget_pass_ratio"],
        "sequence": sequence,
    }


def cores_table(result: dict) -> list[str]:
    """Every core side by side on every cell (ratios are SGLang dfs-weight / that core, one run)."""
    lines = _header(
        [
            "workload",
            "W",
            "prompt",
            "core",
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
        for core in c.get("cores", {}):
            view = core_view(c, core)
            cht, seq = view["cht"], view["sequence"]["cht"]
            lines.append(
                _row(
                    [c["workload"], str(c["num_waiting"]), str(c["prompt_len"]), core]
                    + [_us(cht["insert_s"]["median_s"]), _us(cht["best_s"]["median_s"])]
                    + [_us(_amortised(view, "activate")), _us(_amortised(view, "finish"))]
                    + [
                        _ratio(view["pass_ratio"]["dfs-weight"]),
                        _ratio(view["budget_pass_ratio"]["dfs-weight"]),
                    ]
                    + [_ms(seq["total_s"]), _ratio(view["sequence"]["ratio"]["dfs-weight"])]
                )
            )
    return lines


def _show(spec: TargetSpec, value: float) -> str:
    return _ratio(value) if spec.is_ratio else f"{_us(value)} µs"


def target_table(result: dict, core: str | None = None) -> list[str]:
    """Each target against the worst cell it applies to (figures, not pass/fail tests); `core` picks the
    core and its goals (default: the default core's figures against `TARGETS`)."""
    lines = _header(["target", "goal", "worst cell", "measured", "met"], num_left=3)
    specs = TARGETS if core is None else CORE_TARGETS[core]
    all_cells = result["cells"] if core is None else [core_view(c, core) for c in result["cells"]]
    for spec in specs:
        cells = [c for c in all_cells if spec.applies(c)]
        goal = ("≥ " if spec.is_ratio else "≤ ") + _show(spec, spec.goal)
        if not cells:
            lines.append(_row([spec.name, goal, "no such cell in this run", "", "n/a"]))
            continue
        pick = min if spec.is_ratio else max
        worst = pick(cells, key=spec.value)
        value = spec.value(worst)
        met = value >= spec.goal if spec.is_ratio else value <= spec.goal
        where = f"{worst['workload']} {worst['num_waiting']}×{worst['prompt_len']}"
        lines.append(_row([spec.name, goal, where, _show(spec, value), "yes" if met else "NO"]))
    return lines


def machine_line(meta: dict) -> str:
    """Versions, CPUs and load around the run, from a benchmark's `meta` (the start of its report)."""
    v = meta["versions"]
    return (
        f"SGLang {v['sglang']}, torch {v['torch']}, Python {v['python']}, {meta['cpu_count']} CPUs, "
        f"load average {meta['loadavg_before'][0]:.2f} before / {meta['loadavg_after'][0]:.2f} after"
    )


def overhead_markdown(result: dict) -> str:
    meta = result["meta"]
    head = [
        f"{machine_line(meta)}, chunk size {meta['config']['chunk_size']}, run took {meta['wall_s']:.0f} s.",
        f"Pass: {meta['pass']}.",
        f"GC: {meta['gc']}.",
        f"LPM falls back to FCFS above {meta['lpm_fcfs_above']} waiting requests (cells marked →fcfs).",
        f"SGLang tree cache: {meta['tree_cache']}.",
        "",
    ]
    plan = meta["config"]["plan"]
    until = f"drained or {plan['max_passes']} passes" if plan["max_passes"] else "drained"
    targets: list[str] = []
    for core in meta.get("cht_cores", []):
        targets += ["", f"### Targets, {core} core (figures, not tests)", ""] + target_table(result, core)
    return "\n".join(
        head
        + [f"CHT tables below: the default core ({meta.get('cht_backend', 'python')}).", ""]
        + ["### Per pass (median)", ""]
        + pass_table(result)
        + ["", "### CHT per operation (median of per-sample means)", ""]
        + op_table(result)
        + [
            "",
            "### Whole sequence (all W arrive, k per pass, "
            f"finish {plan['finish_after_passes']} passes later, until {until})",
            "",
        ]
        + sequence_table(result)
        + [
            "",
            "### Prompt reads (every queued prompt read once in arrival order, no hashing, the cache state the "
            "whole runs leave; median)",
            "",
        ]
        + read_table(result)
        + [
            "",
            f"### Cores side by side (default core: {meta.get('cht_backend', 'python')}; one run, "
            "same process, same queues)",
            "",
        ]
        + cores_table(result)
        + targets
    )
