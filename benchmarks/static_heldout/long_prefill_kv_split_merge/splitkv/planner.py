"""Host-side decisions: how a long prompt's KV is cut into chunks, and the decode rows."""

from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import torch


@dataclass
class LongPrompt:
    request_id: int
    page_table: np.ndarray
    prefix_len: int
    q_len: int
    tokens_dev: torch.Tensor
    positions_dev: torch.Tensor


@dataclass
class SplitPlan:
    q_len: int
    prefix_len: int
    chunk_page_ranges: List[Tuple[int, int]]
    kv_lens_np: np.ndarray
    tail_first_page: int
    tail_pages: np.ndarray
    page_table: np.ndarray

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_page_ranges)


@dataclass
class DecodeRows:
    tokens_dev: torch.Tensor
    positions_dev: torch.Tensor
    seq_lens_cpu: torch.Tensor
    indptr_np: np.ndarray
    indices_np: np.ndarray
    last_np: np.ndarray
    prefix_indptr_np: np.ndarray
    prefix_indices_np: np.ndarray
    prefix_last_np: np.ndarray

    @property
    def batch_size(self) -> int:
        return int(self.last_np.shape[0])


@dataclass
class StepWork:
    prefill: Optional[LongPrompt] = None
    decode: Optional[DecodeRows] = None


class ChunkPlanner:
    def __init__(self, cfg):
        self.cfg = cfg
        self._plan_info = None
        self._check_config()

    def _check_config(self) -> None:
        assert self.cfg.page_size & (self.cfg.page_size - 1) == 0, "page size must be a power of two"  # ok: FC109

    def split(self, page_table: np.ndarray, prefix_len: int, q_len: int, max_chunk_pages: int) -> SplitPlan:
        assert max_chunk_pages > 0, "a KV chunk needs at least one page"  # expect: FC109
        ps = self.cfg.page_size
        full_prefix_pages = prefix_len // ps
        ranges = []
        start = 0
        while start < full_prefix_pages:
            end = min(start + max_chunk_pages, full_prefix_pages)
            ranges.append((start, end))
            start = end
        tail_last = (prefix_len + q_len + ps - 1) // ps
        plan = SplitPlan(
            q_len=q_len,
            prefix_len=prefix_len,
            chunk_page_ranges=ranges,
            kv_lens_np=np.asarray([(e - s) * ps for s, e in ranges], dtype=np.int32),
            tail_first_page=full_prefix_pages,
            tail_pages=np.asarray(page_table[full_prefix_pages:tail_last], dtype=np.int32),
            page_table=np.asarray(page_table[:tail_last], dtype=np.int32),
        )
        # our own record of what the chunk wrappers were planned with
        self._plan_info = (q_len, prefix_len, len(ranges))  # ok: FC103
        return plan

    @property
    def last_split(self):
        return self._plan_info
