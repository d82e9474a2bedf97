"""The step's batch, the recycled per-step metadata and the per-bucket graph records."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Deque, Dict, Optional

import torch

from poolserve.pools import TensorPool


@dataclasses.dataclass
class ForwardBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    is_decode: bool = True
    qo_indptr: Optional[torch.Tensor] = None
    extend_lens: Optional[torch.Tensor] = None
    prefix_indptr_cpu: Optional[torch.Tensor] = None  # shared-prefix groups of this step, if any
    prefix_indices: Optional[torch.Tensor] = None
    prefix_last_page_len: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return self.seq_lens_cpu.shape[0]

    @classmethod
    def from_scheduler(cls, host: Dict[str, torch.Tensor], device: torch.device, is_decode: bool) -> "ForwardBatch":
        up = {k: v.to(device, non_blocking=True) for k, v in host.items()}
        return cls(up["input_ids"], up["positions"], up["out_cache_loc"], up["seq_lens"], host["seq_lens"], up["kv_indptr"],
                   host["kv_indptr"], up["kv_indices"], up["kv_last_page_len"], host["kv_last_page_len"], is_decode,
                   up.get("qo_indptr"), up.get("extend_lens"), host.get("prefix_indptr"), up.get("prefix_indices"),
                   up.get("prefix_last_page_len"))


class StepMetadata:
    """Per-step attention metadata; MetadataPool recycles the objects instead of building new ones."""

    __slots__ = ("wrapper", "prefix_wrapper", "kv_indptr", "kv_indices", "kv_last_page_len", "seq_lens",
                 "seq_lens_cpu", "qo_indptr", "bucket", "max_seq_len", "custom_mask", "leases")

    def __init__(self, max_bs: int, device: torch.device):
        self.custom_mask = torch.zeros(max_bs, dtype=torch.bool, device=device)  # ok: FC107
        self.clear()

    def clear(self) -> None:
        self.wrapper = self.prefix_wrapper = self.bucket = self.qo_indptr = self.kv_indptr = self.kv_indices = None
        self.kv_last_page_len, self.seq_lens, self.seq_lens_cpu, self.max_seq_len, self.leases = None, None, None, 0, []

    def reset(self, batch: ForwardBatch, wrapper: Any, capacity: int) -> "StepMetadata":
        assert batch.batch_size <= capacity, f"{batch.batch_size} rows do not fit metadata for {capacity}"  # expect: FC109
        self.wrapper, self.seq_lens, self.seq_lens_cpu = wrapper, batch.seq_lens, batch.seq_lens_cpu
        self.max_seq_len = int(batch.seq_lens.max())  # expect: FC101
        self.custom_mask = self.custom_mask.new_zeros(self.custom_mask.shape)  # expect: FC107
        return self

    def scrub(self) -> None:  # a recycled object must not carry last step's page counts into the next one
        if self.kv_last_page_len is not None:
            self.kv_last_page_len.fill_(1)  # expect: FC104
        self.clear()


class MetadataPool:
    def __init__(self, max_bs: int, device: torch.device):
        self.max_bs, self.device = max_bs, device
        self._idle: Deque[StepMetadata] = collections.deque()
        self.tokens_served = 0

    def acquire(self) -> StepMetadata:
        assert len(self._idle) <= 4 * self.max_bs, "step metadata is leaking into the pool"  # ok: FC109
        return self._idle.pop() if self._idle else StepMetadata(self.max_bs, self.device)

    def release(self, meta: StepMetadata) -> None:
        if meta.seq_lens is not None:
            self.tokens_served += int(meta.seq_lens.sum())  # expect: FC101
        meta.scrub()
        self._idle.append(meta)


class BucketRecord:
    __slots__ = ("bs", "pool", "graph", "draft_graph", "wrapper", "kv_indptr", "kv_indices", "kv_last_page_len",
                 "input_ids", "positions", "loc", "out", "draft_out", "meta")

    def __init__(self, bs: int, pool: TensorPool, graph: Optional[torch.cuda.CUDAGraph] = None):
        self.bs, self.pool, self.graph, self.draft_graph = bs, pool, graph, None
        self.wrapper = self.kv_indptr = self.kv_indices = self.kv_last_page_len = self.meta = None
        self.input_ids = self.positions = self.loc = self.out = self.draft_out = None

    def __del__(self) -> None:
        # the graph and the wrapper that read these die with the record: hand the buffers back
        if self.kv_indices is not None:
            self.pool.release(self.kv_indices, scrub=True)  # ok: FC104
