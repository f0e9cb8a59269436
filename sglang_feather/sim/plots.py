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


def plot_concentration_map(cells: list[dict[str, Any]], path: str | Path) -> Path:
    """One panel per GPU of the concentration sweep (`sweeps.concentration_rows`): rows prefix x groups, columns
    private part; colour = Feather with the rule over without it (where concentrating pays), text = Feather
    over the better of dfs-weight and FCFS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    def parts(case: str) -> tuple[str, str, str]:
        gpu, groups, prefix, private, *variant = case.split()
        return gpu, f"{prefix} {groups}", " ".join([private.removeprefix("private"), *variant])

    def number(text: str) -> tuple[int, ...]:  # "4K 32g" -> (4, 32), "512 eos" -> (512,): numeric order
        return tuple(int(word.rstrip("Kg")) for word in text.split() if word.rstrip("Kg").isdigit())

    gpus = list(dict.fromkeys(parts(c["case"])[0] for c in cells))
    rows = sorted({parts(c["case"])[1] for c in cells}, key=number)
    cols = sorted({parts(c["case"])[2] for c in cells}, key=lambda col: (number(col), col))
    fig, axes = plt.subplots(1, len(gpus), figsize=(4.2 * len(gpus), 0.45 * len(rows) + 1.6), squeeze=False)
    for ax, gpu in zip(axes[0], gpus, strict=True):
        grid = np.full((len(rows), len(cols)), np.nan)
        for c in cells:
            g, r, col = parts(c["case"])
            if g == gpu:
                i, j = rows.index(r), cols.index(col)
                grid[i, j] = c.get("x_noconc", np.nan)
                ax.text(j, i, f"{c['x_best']:.2f}", ha="center", va="center", fontsize=7)
        image = ax.imshow(grid, cmap="RdYlGn", vmin=0.8, vmax=1.2, aspect="auto")
        ax.set_xticks(range(len(cols)), [f"private {c}" for c in cols], fontsize=7)
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        ax.set_title(gpu, fontsize=9)
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="feather / feather with the rule off")
    fig.suptitle(
        "Concentration rule (colour) and Feather / best of dfs-weight, FCFS (text), modelled", fontsize=9
    )
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out
