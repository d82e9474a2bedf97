"""Prometheus-style metrics: host counters and histograms, a few device-side counters."""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from .forward_batch import ForwardBatch, ForwardMode


class Counter:
    kind = "counter"

    def __init__(self, name: str, help_text: str):
        self.name = name
        self.help = help_text
        self._value = 0.0
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self._value += amount

    def render(self) -> List[str]:
        return [f"{self.name} {self._value}"]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float) -> None:
        with self._lock:
            self._value = value


class Histogram:
    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Sequence[float]):
        assert list(buckets) == sorted(buckets), "histogram buckets must be increasing"  # expect: FC109
        self.name = name
        self.help = help_text
        self.bounds = np.asarray(buckets, dtype=np.float64)
        self.counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)
        self.total = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values: np.ndarray) -> None:
        idx = np.searchsorted(self.bounds, values, side="left")
        with self._lock:
            np.add.at(self.counts, idx, 1)
            self.total += float(values.sum())

    def render(self) -> List[str]:
        lines, acc = [], 0
        for bound, c in zip(self.bounds.tolist() + [float("inf")], self.counts.tolist()):
            acc += c
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f'{self.name}_bucket{{le="{le}"}} {acc}')
        lines.append(f"{self.name}_sum {self.total}")
        lines.append(f"{self.name}_count {acc}")
        return lines


class MetricsRegistry:
    def __init__(self, prefix: str = "mserve"):
        self.prefix = prefix
        self._metrics: Dict[str, object] = {}

    def counter(self, name: str, help_text: str = "") -> Counter:
        return self._metrics.setdefault(name, Counter(f"{self.prefix}_{name}", help_text))

    def gauge(self, name: str, help_text: str = "") -> Gauge:
        return self._metrics.setdefault(name, Gauge(f"{self.prefix}_{name}", help_text))

    def histogram(self, name: str, buckets: Sequence[float], help_text: str = "") -> Histogram:
        return self._metrics.setdefault(name, Histogram(f"{self.prefix}_{name}", help_text, buckets))

    def render(self) -> str:
        out: List[str] = []
        for m in self._metrics.values():
            out.append(f"# HELP {m.name} {m.help}")
            out.append(f"# TYPE {m.name} {m.kind}")
            out.extend(m.render())
        return "\n".join(out) + "\n"


_LEN_BUCKETS = [16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
_BS_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


class StepMetrics:
    """Hooks the metadata path calls once per step."""

    def __init__(self, registry: MetricsRegistry, max_slots: int, device: torch.device):
        self.device = device
        self.steps = registry.counter("steps_total", "forward steps")
        self.decode_tokens = registry.counter("generation_tokens_total", "tokens decoded")
        self.prefill_tokens = registry.counter("prompt_tokens_total", "prompt tokens prefilled")
        self.context_tokens = registry.counter("context_tokens_total", "KV tokens attended")
        self.seq_len_hist = registry.histogram("seq_len", _LEN_BUCKETS, "sequence length per request")
        self.batch_hist = registry.histogram("batch_size", _BS_BUCKETS, "requests per step")
        # per-slot decoded-token counters stay on the device; the exporter reads them on scrape
        self.per_slot_tokens = torch.zeros(max_slots, dtype=torch.int64, device=device)
        self.last_seq_lens: Optional[torch.Tensor] = None
        self._ones: Optional[torch.Tensor] = None

    def _ones_for(self, n: int) -> torch.Tensor:
        if self._ones is None:
            self._ones = torch.ones(self.per_slot_tokens.numel(), dtype=torch.int64, device=self.device)  # ok: FC107
        return self._ones[:n]

    def on_step(self, fb: ForwardBatch) -> None:
        self.steps.inc()
        self.batch_hist.observe_many(np.array([fb.batch_size]))
        self.seq_len_hist.observe_many(fb.seq_lens_cpu.numpy())  # ok: FC101
        if fb.forward_mode == ForwardMode.DECODE:
            self.decode_tokens.inc(fb.batch_size)
            self.per_slot_tokens.index_add_(0, fb.req_pool_indices, self._ones_for(fb.batch_size))
        else:
            self.prefill_tokens.inc(fb.extend_num_tokens)
        self.context_tokens.inc(int(fb.seq_lens.sum()))  # expect: FC101
        # kept for the per-request progress gauge computed at scrape time
        self.last_seq_lens = fb.seq_lens.clone()  # expect: FC107
