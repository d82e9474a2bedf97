"""Sequence bookkeeping shared by the graph, the attention op and the planner."""

from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Sequence

import torch


class PlanParams(NamedTuple):
    """Everything a FlashInfer plan depends on besides the page table itself (hashable: a cache key)."""

    num_seqs: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    page_size: int
    is_generate: bool
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    sm_scale: Optional[float] = None


@dataclass
class SequenceInfo:
    """Device arrays the compiled graph reads, and the pinned host mirrors the planner reads."""

    max_seq_len: int
    max_batch_size: int
    page_size: int
    max_num_tokens: int
    device: torch.device = field(default_factory=lambda: torch.device("cuda"))

    def __post_init__(self) -> None:
        pages_per_seq = (self.max_seq_len + self.page_size - 1) // self.page_size
        self.max_pages_per_seq = pages_per_seq
        self.num_pages_in_use = 0
        self.num_tokens = 0
        self._num_seqs = 0
        bs = self.max_batch_size
        with torch.device(self.device):
            self.input_ids = torch.zeros(self.max_num_tokens, dtype=torch.int64)
            self.position_ids = torch.zeros(self.max_num_tokens, dtype=torch.int64)
            self.seq_len = torch.zeros(bs, dtype=torch.int32)
            self.qo_indptr = torch.zeros(bs + 1, dtype=torch.int32)
            self.cu_num_pages = torch.zeros(bs + 1, dtype=torch.int32)
            self.cache_loc = torch.zeros(bs * pages_per_seq, dtype=torch.int32)
            self.page_table = torch.zeros(bs, pages_per_seq, dtype=torch.int32)
            self.last_page_len = torch.ones(bs, dtype=torch.int32)
        self.batch_info_host = torch.zeros(3, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_host = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        self.cu_num_pages_host = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(bs, dtype=torch.int32, pin_memory=True)
        self._host_ids: Optional[torch.Tensor] = None

    @property
    def num_sequences(self) -> int:
        return self._num_seqs

    @property
    def is_generate(self) -> bool:
        """A pure decode step: every sequence brings exactly one new token."""
        qo = self.qo_indptr[: self._num_seqs + 1]
        return bool((qo[1:] - qo[:-1] == 1).all())  # expect: FC101

    def nest_sequences(
        self,
        input_ids: Sequence[Sequence[int]],
        *,
        page_assignments: Sequence[Sequence[int]],
        input_pos: Sequence[int],
    ) -> None:
        """Lay this step's sequences out flat; host mirrors first, then one async copy per device array."""
        assert len(input_ids) == len(page_assignments) == len(input_pos), "one entry per sequence"  # expect: FC109
        n = len(input_ids)
        seq_lens = [len(ids) for ids in input_ids]
        total = sum(seq_lens)
        flat_pages = [p for pages in page_assignments for p in pages]
        if len(flat_pages) > self.cache_loc.numel():
            # more pages in flight than planned for: grow the flat page list
            extra = len(flat_pages) - self.cache_loc.numel()
            self.cache_loc = torch.cat([self.cache_loc, self.cache_loc.new_zeros(extra)])  # expect: FC107
        self._host_ids = torch.tensor([t for ids in input_ids for t in ids], dtype=torch.int64, pin_memory=True)  # ok: FC107
        positions = [pos + i for pos, sl in zip(input_pos, seq_lens) for i in range(sl)]

        qo, cu = [0], [0]
        for sl, pages in zip(seq_lens, page_assignments):
            qo.append(qo[-1] + sl)
            cu.append(cu[-1] + len(pages))
        self.qo_indptr_host[: n + 1] = torch.tensor(qo, dtype=torch.int32)
        self.cu_num_pages_host[: n + 1] = torch.tensor(cu, dtype=torch.int32)
        self.last_page_len_host[:n] = torch.tensor(
            [(pos + sl - 1) % self.page_size + 1 for pos, sl in zip(input_pos, seq_lens)], dtype=torch.int32
        )
        num_prefill = sum(1 for sl in seq_lens if sl > 1)
        self.batch_info_host[0] = num_prefill
        self.batch_info_host[1] = sum(sl for sl in seq_lens if sl > 1)
        self.batch_info_host[2] = n - num_prefill

        self.input_ids[:total].copy_(self._host_ids, non_blocking=True)
        self.position_ids[:total].copy_(torch.tensor(positions, dtype=torch.int64), non_blocking=True)
        self.seq_len[:n].copy_(torch.tensor([p + s for p, s in zip(input_pos, seq_lens)], dtype=torch.int32), non_blocking=True)
        self.qo_indptr[: n + 1].copy_(self.qo_indptr_host[: n + 1], non_blocking=True)
        self.cache_loc[: len(flat_pages)].copy_(torch.tensor(flat_pages, dtype=torch.int32), non_blocking=True)  # ok: FC104
        self.cu_num_pages[: n + 1].copy_(self.cu_num_pages_host[: n + 1], non_blocking=True)
        self.last_page_len[:n].copy_(self.last_page_len_host[:n], non_blocking=True)
        for i, pages in enumerate(page_assignments):
            self.page_table[i, : len(pages)].copy_(torch.tensor(pages, dtype=torch.int32), non_blocking=True)
        self.num_pages_in_use = len(flat_pages)
        self.num_tokens = total
        self._num_seqs = n
