"""Ratios measured side by side in one run, and console tables of measurement rows."""

from __future__ import annotations

from collections import defaultdict

_POINT = ("kernel", "page_size", "prefix_len", "suffix_len", "batch_size")


def ratio_rows(rows: list[dict]) -> list[dict]:
    """Per kernel and shape at equal batch size: heterogeneous (B groups) / homogeneous (1 group) time, and for
    each mixed group count interleaved / contiguous time. Ratios > 1 mean homogeneity or grouping pays."""
    by_point: dict[tuple, dict[tuple[int, str], float]] = defaultdict(dict)
    for row in rows:
        if row.get("status") == "ok":
            by_point[tuple(row[key] for key in _POINT)][(row["num_groups"], row["order"])] = row["median_ms"]
    ratios = []
    for point, times in sorted(by_point.items()):
        key = dict(zip(_POINT, point, strict=True))
        batch = key["batch_size"]
        homogeneous = times.get((1, "contiguous"))
        heterogeneous = times.get((batch, "contiguous"))
        if batch > 1 and homogeneous and heterogeneous:
            ratios.append(
                key
                | {
                    "kind": "heterogeneous/homogeneous",
                    "num_groups": batch,
                    "ratio": heterogeneous / homogeneous,
                }
            )
        for (groups, order), ms in sorted(times.items()):
            contiguous = times.get((groups, "contiguous"))
            if order != "contiguous" and contiguous:
                ratios.append(
                    key | {"kind": f"{order}/contiguous", "num_groups": groups, "ratio": ms / contiguous}
                )
    return ratios


def format_rows(rows: list[dict], *, header: bool) -> str:
    lines = []
    if header:
        lines.append(
            f"{'kernel':<12} {'B':>4} {'G':>4} {'prefix':>6} {'suffix':>6} {'order':<11} {'ms':>9} "
            f"{'uniqGB/s':>9} {'allGB/s':>9}  status"
        )
    for row in rows:
        timed = row.get("status") == "ok"
        ms = f"{row['median_ms']:9.4f}" if timed else " " * 9
        unique = f"{row['unique_gbps']:9.1f}" if timed else " " * 9
        total = f"{row['total_gbps']:9.1f}" if timed else " " * 9
        lines.append(
            f"{row['kernel']:<12} {row['batch_size']:>4} {row['num_groups']:>4} {row['prefix_len']:>6} "
            f"{row['suffix_len']:>6} {row['order']:<11} {ms} {unique} {total}  {row['status']}"
        )
    return "\n".join(lines)


def format_ratios(ratios: list[dict]) -> str:
    lines = [f"{'kernel':<12} {'prefix':>6} {'suffix':>6} {'B':>4} {'G':>4} {'ratio':<26} {'value':>7}"]
    for r in ratios:
        lines.append(
            f"{r['kernel']:<12} {r['prefix_len']:>6} {r['suffix_len']:>6} {r['batch_size']:>4} {r['num_groups']:>4} "
            f"{r['kind']:<26} {r['ratio']:7.2f}"
        )
    return "\n".join(lines)
