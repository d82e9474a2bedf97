"""Per-layer retrieval / streaming head split, from the gate values DuoAttention's
optimisation produces (one row per layer, one column per KV head)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class HeadPattern:
    retrieval_kv_idx: np.ndarray  # [num_layers, num_retrieval]
    stream_kv_idx: np.ndarray  # [num_layers, num_streaming]
    gates: np.ndarray  # [num_layers, num_kv_heads]
    thresholds: np.ndarray  # [num_layers]: gates at or above are retrieval heads

    @property
    def num_retrieval(self) -> int:
        return self.retrieval_kv_idx.shape[1]

    @property
    def num_streaming(self) -> int:
        return self.stream_kv_idx.shape[1]


def load_head_pattern(path: str, num_layers: int, num_kv_heads: int, sparsity: float) -> HeadPattern:
    assert 0.0 <= sparsity < 1.0, f"sparsity must be in [0, 1), got {sparsity}"  # expect: FC109
    gates = np.loadtxt(path, dtype=np.float32, delimiter="\t").reshape(num_layers, num_kv_heads)
    n_stream = int(round(num_kv_heads * sparsity))
    order = np.argsort(gates, axis=1, kind="stable")
    stream = np.sort(order[:, :n_stream], axis=1)
    retrieval = np.sort(order[:, n_stream:], axis=1)
    thresholds = np.take_along_axis(gates, retrieval[:, :1], axis=1)[:, 0]
    return HeadPattern(retrieval.astype(np.int64), stream.astype(np.int64), gates, thresholds)


class HeadSharder:
    """Tensor parallelism: each rank keeps a contiguous slice of the KV heads, and the
    retrieval / streaming split is taken inside the slice."""

    def __init__(self, pattern: HeadPattern, num_kv_heads: int, tp_size: int, tp_rank: int):
        self.pattern = pattern
        self.num_kv_heads = num_kv_heads
        self.tp_size = tp_size
        self.tp_rank = tp_rank

    def _shard_range(self) -> tuple[int, int]:
        assert self.num_kv_heads % self.tp_size == 0  # ok: FC109
        per = self.num_kv_heads // self.tp_size
        return self.tp_rank * per, (self.tp_rank + 1) * per

    def local_pattern(self) -> HeadPattern:
        lo, hi = self._shard_range()
        keep_r = [row[(row >= lo) & (row < hi)] - lo for row in self.pattern.retrieval_kv_idx]
        keep_s = [row[(row >= lo) & (row < hi)] - lo for row in self.pattern.stream_kv_idx]
        return HeadPattern(np.stack(keep_r), np.stack(keep_s), self.pattern.gates[:, lo:hi],
                           self.pattern.thresholds)
