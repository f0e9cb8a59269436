"""Prometheus /metrics snapshots: parse, sum by name and labels, and take before/after differences."""

import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]


class MetricsError(RuntimeError):
    """The /metrics endpoint could not be read or parsed."""


@dataclass(frozen=True)
class MetricsSnapshot:
    samples: Mapping[tuple[str, Labels], float]

    def total(self, name: str, **labels: str) -> float | None:
        """Sum of every sample called `name` whose labels include `labels`; None when there is none."""
        wanted = set(labels.items())
        values = [v for (n, ls), v in self.samples.items() if n == name and wanted <= ls]
        return sum(values) if values else None

    def names(self, contains: str = "") -> list[str]:
        return sorted({n for n, _ in self.samples if contains in n})

    def minus(self, earlier: "MetricsSnapshot") -> "MetricsSnapshot":
        """Per-sample difference (counters and histogram sums); samples absent before count from zero."""
        return MetricsSnapshot({k: v - earlier.samples.get(k, 0.0) for k, v in self.samples.items()})


def parse_metrics(text: str) -> MetricsSnapshot:
    samples: dict[tuple[str, Labels], float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
    except ValueError as exc:
        raise MetricsError(f"cannot parse Prometheus text: {exc}") from exc
    return MetricsSnapshot(samples)


def scrape(base_url: str, timeout_s: float = 10.0) -> MetricsSnapshot:
    url = base_url.rstrip("/") + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return parse_metrics(response.read().decode("utf-8", errors="replace"))
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise MetricsError(f"cannot read {url}: {exc}") from exc
