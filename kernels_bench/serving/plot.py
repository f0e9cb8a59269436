"""Plot a serving-benchmark results file: output throughput and p99 TTFT per workload, one bar per policy."""

import argparse
import json
from pathlib import Path


def load_rows(results: dict) -> list[dict]:
    return [
        {"policy": policy_run["policy"], **run["bench"]}
        for policy_run in results["runs"]
        for run in policy_run["runs"]
    ]


def plot(results_path: Path, out_path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = json.loads(results_path.read_text())
    rows = load_rows(results)
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    width = 0.8 / max(1, len(policies))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    panels = (
        ("output_throughput", "output tokens/s (higher is better)"),
        ("ttft_p99_ms", "p99 TTFT ms (lower)"),
    )
    for ax, (key, label) in zip(axes, panels, strict=True):
        for index, policy in enumerate(policies):
            values = {r["workload"]: r[key] for r in rows if r["policy"] == policy}
            xs = [w + index * width for w in range(len(workloads))]
            ax.bar(xs, [values.get(w, 0.0) for w in workloads], width, label=policy)
        ax.set_xticks([w + width * (len(policies) - 1) / 2 for w in range(len(workloads))], workloads)
        ax.set_ylabel(label)
    axes[0].legend()
    meta = results.get("meta", {})
    fig.suptitle(f"{meta.get('model', '?')} on {meta.get('profile', '?')} ({meta.get('date', '')})")
    fig.tight_layout()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "results", type=Path, help="results.json written by `python -m kernels_bench.serving`"
    )
    parser.add_argument("--out", type=Path, default=None, help="PNG path (default: next to the results)")
    args = parser.parse_args()
    print(plot(args.results, args.out or args.results.with_suffix(".png")))


if __name__ == "__main__":
    main()
