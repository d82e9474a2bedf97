"""Requests and the persistent batch: device tensors beside pinned / numpy host mirrors.

The scheduler fills the numpy views of the pinned mirrors, `upload()` moves them to the device with
`non_blocking=True` copies, and the attention backend reads whichever side it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from snapserve.config import EngineConfig


@dataclass
class Request:
    req_id: str
    prompt_ids: List[int]
    output_ids: List[int] = field(default_factory=list)
    pages: List[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_new_tokens(self) -> int:
        return self.seq_len - self.num_computed


class BatchState:
    """Persistent per-step inputs, sized for the engine's limits once."""

    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        n, t, p = cfg.max_num_reqs, cfg.max_num_tokens, cfg.max_total_pages
        i32 = dict(dtype=torch.int32, device=device)
        self.input_ids = torch.zeros(t, dtype=torch.long, device=device)
        self.positions = torch.zeros(t, dtype=torch.long, device=device)
        self.seq_lens = torch.zeros(n, **i32)
        self.qo_indptr = torch.zeros(n + 1, **i32)
        self.kv_indptr = torch.zeros(n + 1, **i32)
        self.kv_indices = torch.zeros(p, **i32)
        self.kv_last_page_len = torch.zeros(n, **i32)
        self.block_table = torch.zeros(n, cfg.max_pages_per_req, **i32)
        self.slot_mapping = torch.zeros(t, dtype=torch.long, device=device)
        # written by the GPU radix matcher: leading prompt tokens already in the prefix cache
        self.prefix_hit_lens = torch.zeros(n, **i32)

        pin = dict(dtype=torch.int32, device="cpu", pin_memory=True)
        self.input_ids_cpu = torch.zeros(t, dtype=torch.long, device="cpu", pin_memory=True)
        self.positions_cpu = torch.zeros(t, dtype=torch.long, device="cpu", pin_memory=True)
        self.slot_mapping_cpu = torch.zeros(t, dtype=torch.long, device="cpu", pin_memory=True)
        self.seq_lens_cpu = torch.zeros(n, **pin)
        self.qo_indptr_cpu = torch.zeros(n + 1, **pin)
        self.kv_indptr_cpu = torch.zeros(n + 1, **pin)
        self.kv_indices_cpu = torch.zeros(p, **pin)
        self.kv_last_page_len_cpu = torch.zeros(n, **pin)
        self.block_table_cpu = torch.zeros(n, cfg.max_pages_per_req, **pin)

        self.seq_lens_np: np.ndarray = self.seq_lens_cpu.numpy()
        self.qo_indptr_np: np.ndarray = self.qo_indptr_cpu.numpy()
        self.kv_indptr_np: np.ndarray = self.kv_indptr_cpu.numpy()
        self.kv_indices_np: np.ndarray = self.kv_indices_cpu.numpy()
        self.kv_last_page_len_np: np.ndarray = self.kv_last_page_len_cpu.numpy()
        self.block_table_np: np.ndarray = self.block_table_cpu.numpy()

        self.requests: List[Request] = []
        self.num_reqs = 0
        self.num_tokens = 0
        self.is_decode = True
        self.has_prefix_hits = False

    def fill(self, requests: List[Request]) -> None:
        """Host side only: numpy writes into the pinned mirrors."""
        page = self.cfg.page_size
        self.requests = list(requests)
        self.num_reqs = len(requests)
        self.is_decode = all(r.num_new_tokens == 1 for r in requests)
        self.has_prefix_hits = any(r.num_cached > 0 for r in requests)
        self.qo_indptr_np[0] = 0
        self.kv_indptr_np[0] = 0
        tok = 0
        for i, r in enumerate(requests):
            new = r.num_new_tokens
            ids = (r.prompt_ids + r.output_ids)[r.num_computed:]
            self.input_ids_cpu[tok: tok + new] = torch.as_tensor(ids, dtype=torch.long)
            self.positions_cpu[tok: tok + new] = torch.arange(r.num_computed, r.seq_len)
            for j, pos in enumerate(range(r.num_computed, r.seq_len)):
                self.slot_mapping_cpu[tok + j] = r.pages[pos // page] * page + pos % page
            tok += new
            self.qo_indptr_np[i + 1] = tok
            self.seq_lens_np[i] = r.seq_len
            npages = len(r.pages)
            start = self.kv_indptr_np[i]
            self.kv_indptr_np[i + 1] = start + npages
            self.kv_indices_np[start: start + npages] = r.pages
            self.block_table_np[i, :npages] = r.pages
            self.kv_last_page_len_np[i] = (r.seq_len - 1) % page + 1
        self.num_tokens = tok

    def upload(self) -> None:
        n, t = self.num_reqs, self.num_tokens
        nnz = int(self.kv_indptr_np[n])
        self.input_ids[:t].copy_(self.input_ids_cpu[:t], non_blocking=True)
        self.positions[:t].copy_(self.positions_cpu[:t], non_blocking=True)
        self.slot_mapping[:t].copy_(self.slot_mapping_cpu[:t], non_blocking=True)
        self.seq_lens[:n].copy_(self.seq_lens_cpu[:n], non_blocking=True)
        self.qo_indptr[: n + 1].copy_(self.qo_indptr_cpu[: n + 1], non_blocking=True)
        self.kv_indptr[: n + 1].copy_(self.kv_indptr_cpu[: n + 1], non_blocking=True)
        self.kv_indices[:nnz].copy_(self.kv_indices_cpu[:nnz], non_blocking=True)
        self.kv_last_page_len[:n].copy_(self.kv_last_page_len_cpu[:n], non_blocking=True)
        self.block_table[:n].copy_(self.block_table_cpu[:n], non_blocking=True)

    def num_pages_host(self, n: Optional[int] = None) -> int:
        return int(self.kv_indptr_np[self.num_reqs if n is None else n])
