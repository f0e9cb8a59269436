"""Draw docs/sim_paper.png and docs/sim_groups_h200.png from the results/sim/*.json runs listed in docs/simulator.md."""

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ORDER = ["fcfs", "lpm", "dfs-weight", "feather (static)", "feather (ucb)"]
STYLE = {"fcfs": "o-", "lpm": "x--", "dfs-weight": "s-", "feather (static)": "v-", "feather (ucb)": "^-"}


def runs(base):
    out = []
    for name, lab in ((base, "feather (ucb)"), (base + "_static", "feather (static)")):
        for r in json.load(open(f"{name}.json"))["runs"]:
            r["label"] = lab if r["policy"] == "feather" else r["policy"]
            out.append(r)
    return out


def panel(ax, base, key, title, relative):
    rs = runs(base)
    xs = sorted({r["sweep"][key] for r in rs})
    fcfs = {r["sweep"][key]: r["output_tok_s"] for r in rs if r["label"] == "fcfs"}
    for lab in ORDER:
        pts = sorted((r["sweep"][key], r["output_tok_s"]) for r in rs if r["label"] == lab)
        ys = [y / fcfs[x] if relative else y for x, y in pts]
        ax.plot([str(x) for x, _ in pts], ys, STYLE[lab], label=lab)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(key)
    ax.set_ylabel("tok/s / FCFS" if relative else "output tok/s")
    ax.grid(alpha=0.3)
    return xs


fig, axes = plt.subplots(1, 4, figsize=(16, 3.8), sharey=True)
for ax, (base, title) in zip(
    axes,
    [
        ("paper_h200", "H200 (L2 must hold whole prefix)"),
        ("paper_h200_rw2048", "H200, what-if reuse_window_tokens=2048"),
        ("paper_a100", "A100-80GB"),
        ("paper_ada", "RTX 6000 Ada (paper's GPU)"),
    ],
    strict=True,
):
    panel(ax, base, "prefix_len", title, True)
axes[0].legend(fontsize=8)
fig.suptitle(
    "Paper experiment (8 groups x 100, warm cache, Llama-3-8B): modelled throughput relative to FCFS",
    fontsize=10,
)
fig.tight_layout()
fig.savefig("sim_paper.png", dpi=110)

fig, ax = plt.subplots(figsize=(6, 4))
panel(ax, "groups_h200", "num_groups", "H200, 4K prefix, 100 prompts/group, warm cache", False)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig("sim_groups_h200.png", dpi=110)
