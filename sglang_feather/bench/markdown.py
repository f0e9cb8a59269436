"""Markdown cells and tables for the benchmark reports."""

from __future__ import annotations


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}" if seconds >= 1e-3 else f"{seconds * 1e3:.4f}"


def ratio(value: float) -> str:
    return f"{value:,.0f}×" if value >= 10 else f"{value:.1f}×"


def row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def header(names: list[str], num_left: int = 1) -> list[str]:
    """A markdown header; the first `num_left` columns align left, the (numeric) rest right."""
    return [row(names), "|" + "---|" * num_left + "---:|" * (len(names) - num_left)]
