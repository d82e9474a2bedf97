"""Prometheus-style counters, gauges and histograms, rendered in the text exposition format."""

import bisect
import threading
from typing import Dict, Sequence

import numpy as np


class Gauge:
    kind = "gauge"

    def __init__(self, name: str, doc: str = ""):
        self.name, self.doc, self.value = name, doc, 0.0

    def set(self, v: float) -> None:
        self.value = v

    def render(self) -> str:
        return f"# TYPE {self.name} {self.kind}\n{self.name} {self.value}\n"


class Counter(Gauge):
    kind = "counter"

    def inc(self, n: float = 1.0) -> None:
        self.value += n


class Histogram:
    def __init__(self, name: str, buckets: Sequence[float], doc: str = ""):
        assert list(buckets) == sorted(buckets), "histogram buckets must be increasing"  # expect: FC109
        self.name, self.doc = name, doc
        self.bounds = list(buckets)
        self.counts_hist = np.zeros(len(self.bounds) + 1, dtype=np.int64)
        self.total = 0.0

    def observe(self, v: float) -> None:
        self.counts_hist[bisect.bisect_left(self.bounds, v)] += 1
        self.total += v

    def quantile(self, q: float) -> float:
        cum = np.cumsum(self.counts_hist)
        if cum[-1] == 0:
            return 0.0
        idx = int(np.searchsorted(cum, q * cum[-1]))
        return self.bounds[min(idx, len(self.bounds) - 1)]

    def render(self) -> str:
        lines = [f"# TYPE {self.name} histogram"]
        cum = np.cumsum(self.counts_hist)
        for b, c in zip(self.bounds, cum[:-1]):
            lines.append(f'{self.name}_bucket{{le="{b}"}} {int(c)}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {int(cum[-1])}')
        lines.append(f"{self.name}_sum {self.total}")
        lines.append(f"{self.name}_count {int(cum[-1])}")
        return "\n".join(lines) + "\n"


class MetricsRegistry:
    def __init__(self, prefix: str = "slo_serve"):
        self.prefix = prefix
        self.lock = threading.Lock()
        self.metrics: Dict[str, object] = {}

    def _get(self, name: str, factory):
        full = f"{self.prefix}_{name}"
        with self.lock:
            if full not in self.metrics:
                self.metrics[full] = factory(full)
            return self.metrics[full]

    def counter(self, name: str) -> Counter:
        return self._get(name, Counter)

    def gauge(self, name: str) -> Gauge:
        return self._get(name, Gauge)

    def histogram(self, name: str, buckets: Sequence[float]) -> Histogram:
        return self._get(name, lambda full: Histogram(full, buckets))

    def render(self) -> str:
        with self.lock:
            return "".join(m.render() for m in self.metrics.values())
