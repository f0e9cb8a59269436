"""Overhead results as JSON-ready dicts and the markdown tables printed from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sglang_feather.bench.cht_side import ChtCell, ChtSequence
from sglang_feather.bench.markdown import header, ms, ratio, row, us
from sglang_feather.bench.targets import backends_table, target_table


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
    backends: dict[str, tuple[ChtCell, tuple[ChtSequence, int]]] = field(default_factory=dict)
    """Every CHT backend measured (name -> cell and sequence); `cht`/`cht_sequence` are the default backend's."""
    prompt_read_s: float | None = None
    """Reading every queued prompt once with no hashing (`cht_side.prompt_read_s`); None without the compiled
    tree."""

    def backend_json(self, cht: ChtCell, cht_sequence: tuple[ChtSequence, int]) -> dict:
        """One backend's figures and its ratios against every SGLang policy."""
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
            "backends": {name: self.backend_json(*measured) for name, measured in self.backends.items()},
            "prompt_read_s": self.prompt_read_s,
        }


def cht_json(cell: ChtCell) -> dict:
    """`asdict`, with the per-k pass costs keyed by str(k) as JSON will have them."""
    data = asdict(cell)
    data["passes"] = {str(k): v for k, v in data["passes"].items()}
    return data


def _policy_cell(policy: str, entry: dict) -> str:
    if entry["active_policy"] != policy:
        return f"→{entry['active_policy']} {ms(entry['median_s'])}"
    return ms(entry["median_s"])


def _ratio_cell(policy: str, entry: dict, value: float) -> str:
    return f"({entry['active_policy']})" if entry["active_policy"] != policy else ratio(value)


def pass_table(result: dict) -> list[str]:
    k = result["meta"]["config"]["plan"]["num_per_pass"]
    policies = list(result["cells"][0]["sglang"])
    lines = header(
        ["workload", "W", "prompt"]
        + [f"SGLang {p} ms" for p in policies]
        + [f"CHT µs, k={k}"]
        + [f"{p} / CHT" for p in policies]
        + ["budget k", "CHT µs, budget k", "dfs-weight / CHT, budget k"]
    )
    for c in result["cells"]:
        budget_k = c["budget_k"]
        lines.append(
            row(
                [c["workload"], str(c["num_waiting"]), str(c["prompt_len"])]
                + [_policy_cell(p, c["sglang"][p]) for p in policies]
                + [us(c["cht"]["pass_s"]["median_s"])]
                + [_ratio_cell(p, c["sglang"][p], c["pass_ratio"][p]) for p in policies]
                + [str(budget_k), us(c["cht"]["passes"][str(budget_k)]["median_s"])]
                + [ratio(c["budget_pass_ratio"]["dfs-weight"])]
            )
        )
    return lines


def op_table(result: dict) -> list[str]:
    lines = header(
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
            row(
                [c["workload"], str(c["num_waiting"]), str(c["prompt_len"])]
                + [us(cht[k]["median_s"]) for k in ("insert_s", "hash_s", "best_s", "activate_s", "finish_s")]
            )
        )
    return lines


def sequence_table(result: dict) -> list[str]:
    policies = list(result["cells"][0]["sglang"])
    lines = header(
        ["workload", "W", "prompt", "k", "passes"]
        + [f"SGLang {p} ms" for p in policies]
        + ["CHT ms (insert + best + activate + finish)", "CHT activate µs/op", "CHT finish µs/op"]
        + [f"{p} / CHT" for p in policies],
    )
    for c in result["cells"]:
        seq = c["sequence"]
        cht = seq["cht"]
        parts = " + ".join(ms(cht[k]) for k in ("insert_s", "best_s", "activate_s", "finish_s"))
        sglang = []
        for p in policies:
            s = seq["sglang"][p]
            fcfs = f" ({s['num_fcfs_passes']}/{s['num_passes']} →fcfs)" if s["num_fcfs_passes"] else ""
            sglang.append(ms(s["total_s"]) + fcfs)
        lines.append(
            row(
                [c["workload"], str(c["num_waiting"]), str(c["prompt_len"]), str(seq["num_per_pass"])]
                + [str(cht["num_passes"])]
                + sglang
                + [
                    f"{ms(cht['total_s'])} = {parts}",
                    us(cht["activate_s"] / max(cht["num_activate"], 1)),
                    us(cht["finish_s"] / max(cht["num_finish"], 1)),
                ]
                + [ratio(seq["ratio"][p]) for p in policies]
            )
        )
    return lines


def read_table(result: dict) -> list[str]:
    """The floor under every insert: reading the queued prompts once, against the whole runs."""
    policies = list(result["cells"][0]["sglang"])
    lines = header(
        ["workload", "W", "prompt", "read every prompt once ms", "CHT inserts / read"]
        + [f"{p} whole run / read (no backend's ratio can pass this)" for p in policies]
    )
    for c in result["cells"]:
        read_s = c.get("prompt_read_s")
        if read_s is None:
            continue
        seq = c["sequence"]
        lines.append(
            row(
                [c["workload"], str(c["num_waiting"]), str(c["prompt_len"]), ms(read_s)]
                + [f"{seq['cht']['insert_s'] / read_s:.1f}×"]
                + [ratio(seq["sglang"][p]["total_s"] / read_s) for p in policies]
            )
        )
    return lines


def run_meta(
    started: float, load_before: tuple[float, float, float], engines: dict[str, str] | None = None
) -> dict:
    """What every benchmark's report starts from: versions, CPUs, load around the run, its wall time.
    `engines`: engine name -> version (default SGLang's and torch's, imported here)."""
    import os
    import platform
    import time

    if engines is None:
        import sglang
        import torch

        engines = {"sglang": sglang.__version__, "torch": torch.__version__}
    return {
        "versions": {**engines, "python": platform.python_version()},
        "cpu_count": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "wall_s": time.time() - started,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
    }


def machine_line(meta: dict) -> str:
    """Versions, CPUs and load around the run, from a benchmark's `meta` (the start of its report)."""
    versions = ", ".join(f"{ENGINE_NAMES.get(name, name)} {v}" for name, v in meta["versions"].items())
    return (
        f"{versions}, {meta['cpu_count']} CPUs, "
        f"load average {meta['loadavg_before'][0]:.2f} before / {meta['loadavg_after'][0]:.2f} after"
    )


ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM", "python": "Python"}
"""How `machine_line` spells a version's name (others as they are)."""


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
    for name in meta.get("cht_backends", []):
        targets += ["", f"### Targets, {name} tree (figures, not tests)", ""] + target_table(result, name)
    return "\n".join(
        head
        + [f"CHT tables below: the default backend ({meta.get('cht_backend', 'python')}).", ""]
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
            f"### Backends side by side (default: {meta.get('cht_backend', 'python')}; one run, "
            "same process, same queues)",
            "",
        ]
        + backends_table(result)
        + targets
    )
