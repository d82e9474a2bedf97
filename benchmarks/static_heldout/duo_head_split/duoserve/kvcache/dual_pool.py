"""Two KV pools: pages of the retrieval heads (grow with the sequence) and, per
request slot, a fixed set of pages for the streaming heads: sink pages followed by
a ring of recent pages."""
from __future__ import annotations

import math

import numpy as np
import torch

from duoserve.config import DuoConfig
from duoserve.kvcache.head_pattern import HeadPattern


def roll_window_pages(indices: torch.Tensor, indptr_np: np.ndarray, rows: np.ndarray, sink_pages: int) -> None:
    """Rotate the recent part of each row's streaming page list by one page (the
    oldest recent page becomes the newest) after the ring wrapped."""
    for r in rows.tolist():
        start, end = int(indptr_np[r]) + sink_pages, int(indptr_np[r + 1])
        if end - start > 1:
            indices[start:end] = torch.roll(indices[start:end], -1)


class DualKVPool:
    def __init__(self, cfg: DuoConfig, pattern: HeadPattern, device: torch.device):
        self.page_size = cfg.page_size
        self.sink_tokens = cfg.sink_tokens
        self.recent_tokens = cfg.recent_tokens
        self.window_tokens = cfg.sink_tokens + cfg.recent_tokens
        self.sink_pages = math.ceil(cfg.sink_tokens / cfg.page_size)
        self.recent_pages = math.ceil(cfg.recent_tokens / cfg.page_size)
        self.stream_pages_per_req = self.sink_pages + self.recent_pages
        self.max_reqs = cfg.max_running_requests
        self.max_full_pages = math.ceil(cfg.max_context_len / cfg.page_size)
        h_r, h_s, d = pattern.num_retrieval, pattern.num_streaming, cfg.head_dim
        self.full_kv = [torch.zeros(cfg.num_full_pages, 2, h_r, cfg.page_size, d, dtype=torch.bfloat16, device=device)
                        for _ in range(cfg.num_layers)]
        n_stream_pages = self.max_reqs * self.stream_pages_per_req
        self.stream_kv = [torch.zeros(n_stream_pages, 2, h_s, cfg.page_size, d, dtype=torch.bfloat16, device=device)
                          for _ in range(cfg.num_layers)]
        self.req_to_full_pages_np = np.zeros((self.max_reqs, self.max_full_pages), dtype=np.int32)
        self.req_to_full_pages = torch.zeros(self.max_reqs, self.max_full_pages, dtype=torch.int32, device=device)
        self.stream_base_gpu = torch.arange(self.max_reqs, dtype=torch.int64, device=device) * self.stream_pages_per_req
        self.free_full = list(range(cfg.num_full_pages - 1, 0, -1))
        self.free_slots = list(range(self.max_reqs - 1, -1, -1))
        self.num_wrapped_steps = 0

    def alloc(self, num_tokens: int) -> int:
        slot = self.free_slots.pop()
        n = math.ceil(num_tokens / self.page_size)
        self.req_to_full_pages_np[slot, :n] = [self.free_full.pop() for _ in range(n)]
        return slot

    def grow(self, slot: int, seq_len: int) -> None:
        n_have = int(np.count_nonzero(self.req_to_full_pages_np[slot]))
        if seq_len > n_have * self.page_size:
            self.req_to_full_pages_np[slot, n_have] = self.free_full.pop()

    def free(self, slot: int) -> None:
        pages = self.req_to_full_pages_np[slot]
        self.free_full.extend(pages[pages > 0].tolist())
        pages[:] = 0
        self.free_slots.append(slot)

    def sync_page_table(self, slots: np.ndarray) -> None:
        rows = torch.from_numpy(self.req_to_full_pages_np[slots])
        self.req_to_full_pages[torch.from_numpy(slots)] = rows.to(self.req_to_full_pages.device, non_blocking=True)

    def append_decode_slots(self, req_slots: torch.Tensor, seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """KV write locations of the new token: one in the full pool, one in the ring."""
        pos = (seq_lens - 1).to(torch.int64)
        if (seq_lens > self.window_tokens).any():  # expect: FC101
            self.num_wrapped_steps += 1
        page = self.page_size
        full_page = self.req_to_full_pages[req_slots, pos // page].to(torch.int64)
        full_loc = full_page * page + pos % page
        ring = torch.where(pos < self.sink_tokens, pos,  # ok: FC101
                           self.sink_tokens + (pos - self.sink_tokens) % self.recent_tokens)
        stream_loc = self.stream_base_gpu[req_slots] * page + ring
        return full_loc, stream_loc

    def store(self, layer: int, k_r: torch.Tensor, v_r: torch.Tensor, k_s: torch.Tensor, v_s: torch.Tensor,
              full_loc: torch.Tensor, stream_loc: torch.Tensor) -> None:
        torch.ops.duo_kernels.store_paged_kv(self.full_kv[layer], k_r, v_r, full_loc, self.page_size)
        torch.ops.duo_kernels.store_paged_kv(self.stream_kv[layer], k_s, v_s, stream_loc, self.page_size)
