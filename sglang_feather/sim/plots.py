"""PNG plots of a sweep: output throughput per policy against the swept workload option."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_sweep(key: str, points: list[dict[str, Any]], out_dir: str | Path, title: str) -> Path:
    """`points`: one dict per run with `value` (the swept option), `policy` and `output_tok_s`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in dict.fromkeys(p["policy"] for p in points):
        xs = [p["value"] for p in points if p["policy"] == policy]
        ys = [p["output_tok_s"] for p in points if p["policy"] == policy]
        ax.plot(xs, ys, marker="o", label=policy)
    ax.set_xlabel(key)
    ax.set_ylabel("output tokens/s (modelled)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / f"throughput_vs_{key}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
