"""Brings the decode graphs back in line with the pool after a resize."""

from __future__ import annotations

from typing import List, Protocol

import numpy as np
import torch

from el_attn.backend import ElasticAttnBackend
from elastic.pool import ElasticKVPool


class GraphRecapturer(Protocol):
    def capture_one_batch_size(self, bs: int) -> None: ...

    def captured_sizes(self) -> List[int]: ...


class GraphRebinder:
    def __init__(self, backend: ElasticAttnBackend, runner: GraphRecapturer, pool: ElasticKVPool):
        self.backend = backend
        self.runner = runner
        self.pool = pool

    def after_shrink(self, mapping_np: np.ndarray) -> None:
        """Page ids moved: remap the tables the graphs read, in place."""
        mapping_dev = torch.from_numpy(mapping_np).to(self.pool.device, non_blocking=True)
        self.pool.remap_dev[: mapping_dev.numel()].copy_(mapping_dev)  # ok: FC104
        bufs = self.backend.graph_bufs
        n = int(self.backend.kv_indptr_host[-1])
        bufs["indices"][:n] = mapping_dev[bufs["indices"][:n].long()]  # expect: FC104
        self.pool.finish_resize()

    def rebind_indices(self, capacity: int) -> None:
        """Longer requests allowed after a grow: give the graphs a wider indices buffer."""
        old = self.backend.kv_indices
        fresh = torch.cat([old, old.new_zeros(capacity - old.numel())])
        for w in self.backend.decode_wrappers.values():
            w._paged_kv_indices_buf = fresh  # expect: FC103
        self.backend.kv_indices = fresh
        self.backend.graph_bufs["indices"] = fresh

    def after_grow(self, new_max_pages_per_req: int) -> None:
        """The cache tensor moved: every captured graph must be captured again."""
        needed = self.backend.cfg.max_batch * new_max_pages_per_req
        if needed > self.backend.kv_indices.numel():
            self.rebind_indices(needed)
        for bs in self.runner.captured_sizes():
            self.runner.capture_one_batch_size(bs)
        self.pool.finish_resize()
