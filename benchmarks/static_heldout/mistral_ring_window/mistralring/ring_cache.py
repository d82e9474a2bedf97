"""Rolling sliding-window KV cache.

Each running request owns one *ring* of ``ring_pages`` physical pages.  Logical
page ``p`` of a request lives in ring slot ``p % ring_pages``; once the request
is longer than the window, the slot of its oldest page is reused for the page
being written and the ring head moves on.  FlashInfer wants the pages of a
request oldest-first, so the page table of the running batch is rotated by the
ring heads every step.  Full-context (global) layers use an ordinary paged pool
in which slot ``s`` owns ``max_context_pages`` consecutive pages.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from mistralring.config import MistralRingConfig


@dataclasses.dataclass
class RingPageTable:
    """Page table of the running batch, oldest page first for every request."""

    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    indptr_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor


@dataclasses.dataclass
class RingBatch:
    req_slots: torch.Tensor  # device int64: the ring each request owns
    seq_lens: torch.Tensor  # device int32: tokens including the one decoded now
    seq_lens_cpu: torch.Tensor  # host mirror of seq_lens
    kv_page_counts: torch.Tensor  # device int32: live pages in each ring
    graph_bs: Optional[int] = None

    @property
    def batch_size(self) -> int:
        return self.seq_lens_cpu.shape[0]

    @property
    def window_pages(self) -> int:
        return int(self.kv_page_counts.sum())  # expect: FC101


class RingKVCache:
    def __init__(self, cfg: MistralRingConfig, device: torch.device):
        assert cfg.sliding_window % cfg.page_size == 0, "the window must be page aligned"  # expect: FC109
        self.cfg = cfg
        self.device = device
        self.ring_pages = cfg.ring_pages
        self._window_left = cfg.sliding_window - 1  # ok: FC103
        max_bs = cfg.max_batch_size
        R, P, C = self.ring_pages, cfg.page_size, cfg.max_context_pages
        shape = (2, P, cfg.num_kv_heads, cfg.head_dim)
        self.ring_kv: Dict[int, torch.Tensor] = {}
        self.global_kv: Dict[int, torch.Tensor] = {}
        for layer_id in range(cfg.num_layers):
            if cfg.is_global_layer(layer_id):
                self.global_kv[layer_id] = torch.zeros((max_bs * C, *shape), dtype=cfg.dtype, device=device)
            else:
                self.ring_kv[layer_id] = torch.zeros((max_bs * R, *shape), dtype=cfg.dtype, device=device)

        cols = torch.arange(R, dtype=torch.int32, device=device)
        self._ring_cols = cols
        self.slot_pages = torch.arange(max_bs, dtype=torch.int32, device=device).unsqueeze(1) * R + cols
        self.ring_head = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.ring_head_cpu = torch.zeros(max_bs, dtype=torch.int32)
        # rotated page table of the running batch; the trtllm-gen path reads it as block_tables
        self.batch_table = torch.zeros(max_bs, R, dtype=torch.int32, device=device)
        self.table_slots: List[int] = []
        self.free_slots: List[int] = list(range(max_bs - 1, -1, -1))

    # ------------------------------------------------------------------ slots
    def admit(self, prompt_len: int) -> int:
        if not self.free_slots:
            raise RuntimeError(f"all {self.cfg.max_batch_size} ring slots are taken")
        slot = self.free_slots.pop()
        P, R = self.cfg.page_size, self.ring_pages
        prompt_pages = -(-prompt_len // P)
        head = max(0, prompt_pages - R) % R
        self.ring_head_cpu[slot] = head
        self.ring_head[slot] = head
        self.table_slots.append(slot)
        self._check_slots()
        return slot

    def release(self, slot: int) -> None:
        self.table_slots.remove(slot)
        self.free_slots.append(slot)
        self.ring_head_cpu[slot] = 0
        self._check_slots()

    def _check_slots(self) -> None:
        assert len(self.free_slots) + len(self.table_slots) == self.cfg.max_batch_size  # ok: FC109

    @property
    def window_left(self) -> int:
        return self._window_left

    def oldest_page(self, slot: int) -> int:
        head = int(self.ring_head_cpu[slot])  # ok: FC101
        return slot * self.ring_pages + head

    # ----------------------------------------------------------- every step
    def advance(self, batch: RingBatch) -> torch.Tensor:
        """Account for the token written this step; returns the rings that wrapped (device)."""
        P, R = self.cfg.page_size, self.ring_pages
        lens = batch.seq_lens
        opens_page = (lens - 1) % P == 0
        wrapped = opens_page & ((lens + P - 1) // P > R)
        heads = self.ring_head[batch.req_slots]
        self.ring_head[batch.req_slots] = torch.where(wrapped, (heads + 1) % R, heads)  # ok: FC101
        # the host mirror follows from the host lengths, without reading the device
        lens_np = batch.seq_lens_cpu.numpy()
        wrapped_np = ((lens_np - 1) % P == 0) & ((lens_np + P - 1) // P > R)
        for slot, did_wrap in zip(self.table_slots, wrapped_np.tolist()):
            if did_wrap:
                self.ring_head_cpu[slot] = (self.ring_head_cpu[slot] + 1) % R
        return wrapped

    def rotate_heads(self, batch: RingBatch) -> None:
        """Rebuild the running batch's page table, oldest page first."""
        heads = self.ring_head[batch.req_slots]
        rows = []
        for slot, head in zip(self.table_slots, heads.tolist()):  # expect: FC101
            rows.append(self.slot_pages[slot : slot + 1].roll(-head, dims=1))
        self.batch_table = torch.cat(rows, dim=0)  # expect: FC107

    def build_page_table(self, batch: RingBatch) -> RingPageTable:
        n = batch.batch_size
        P, R = self.cfg.page_size, self.ring_pages
        counts = batch.kv_page_counts
        indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(counts, 0, dtype=torch.int32, out=indptr[1:])
        live = self._ring_cols.unsqueeze(0) < counts.unsqueeze(1)
        indices = self.batch_table[:n][live]  # expect: FC101
        lens_cpu = batch.seq_lens_cpu
        counts_cpu = torch.clamp((lens_cpu + P - 1) // P, max=R)
        indptr_cpu = torch.zeros(n + 1, dtype=torch.int32)
        torch.cumsum(counts_cpu, 0, dtype=torch.int32, out=indptr_cpu[1:])
        return RingPageTable(
            indptr=indptr, indices=indices, last_page_len=((batch.seq_lens - 1) % P + 1).to(torch.int32),
            indptr_cpu=indptr_cpu, last_page_len_cpu=((lens_cpu - 1) % P + 1).to(torch.int32),
        )

    def global_page_table(self, batch: RingBatch) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Page table of the full-context layers, built from the host lengths."""
        P, C = self.cfg.page_size, self.cfg.max_context_pages
        lens = batch.seq_lens_cpu.numpy()
        pages = (lens + P - 1) // P
        indptr = np.zeros(len(lens) + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1:])
        per_req = pages.tolist()  # ok: FC101
        indices = np.concatenate(
            [np.arange(s * C, s * C + p, dtype=np.int32) for s, p in zip(self.table_slots, per_req)]
        )
        last = ((lens - 1) % P + 1).astype(np.int32)
        return torch.tensor(indptr), torch.from_numpy(indices).to(self.device, non_blocking=True), torch.tensor(last)

    def global_lens_device(self, batch: RingBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        """indptr / last_page_len of the full-context layers, computed on the device."""
        P = self.cfg.page_size
        pages = (batch.seq_lens + P - 1) // P
        indptr = torch.zeros(batch.batch_size + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(pages, 0, dtype=torch.int32, out=indptr[1:])
        last = ((batch.seq_lens - 1) % P + 1).to(torch.int32)
        return indptr, last

    # --------------------------------------------------------------- writes
    def ring_write_slots(self, batch: RingBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        P, R = self.cfg.page_size, self.ring_pages
        pos = batch.seq_lens.long() - 1
        page = batch.req_slots * R + (pos // P) % R
        return page, pos % P

    def global_write_slots(self, batch: RingBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        P, C = self.cfg.page_size, self.cfg.max_context_pages
        pos = batch.seq_lens.long() - 1
        return batch.req_slots * C + pos // P, pos % P
