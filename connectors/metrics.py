"""One small metrics interface for every process, with a Prometheus implementation.

Components count what they do and, above all, every dropped or rejected item with its reason:
`metrics.count("samples_rejected", reason="no_valid_hint")`. Each process owns one registry and
exposes it (serving at /metrics).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    """Counters, gauges and histograms created on first use; label names are fixed by that first use."""

    def __init__(self, prefix: str = "orl") -> None:
        self.prefix = prefix
        self.registry = CollectorRegistry()
        self._counters: dict[str, Counter] = {}
        self._gauges: dict[str, Gauge] = {}
        self._histograms: dict[str, Histogram] = {}

    def count(self, name: str, amount: float = 1.0, **labels: str) -> None:
        metric = self._counters.get(name)
        if metric is None:
            metric = self._counters[name] = Counter(
                f"{self.prefix}_{name}", name.replace("_", " "), sorted(labels), registry=self.registry
            )
        (metric.labels(**labels) if labels else metric).inc(amount)

    def set(self, name: str, value: float, **labels: str) -> None:
        metric = self._gauges.get(name)
        if metric is None:
            metric = self._gauges[name] = Gauge(
                f"{self.prefix}_{name}", name.replace("_", " "), sorted(labels), registry=self.registry
            )
        (metric.labels(**labels) if labels else metric).set(value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        metric = self._histograms.get(name)
        if metric is None:
            metric = self._histograms[name] = Histogram(
                f"{self.prefix}_{name}", name.replace("_", " "), sorted(labels), registry=self.registry
            )
        (metric.labels(**labels) if labels else metric).observe(value)

    def exposition(self) -> bytes:
        """The Prometheus text format of everything recorded so far."""
        return generate_latest(self.registry)
