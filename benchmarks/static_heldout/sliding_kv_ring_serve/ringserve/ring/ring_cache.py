"""Ring-buffer paged KV cache: token t of a request lives in ring slot (t // page_size) % window_pages, so
past the window each new page overwrites the oldest one and the page table (oldest first) rotates by one.
Global (full-attention) layers keep an append-only page run per request in a separate region."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from ringserve.config import RingConfig
from ringserve.utils import stage_like


class RingKVCache:
    def __init__(self, cfg: RingConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self.window_pages = cfg.window_pages
        self.max_requests = cfg.max_requests
        self.num_ring_pages = cfg.max_requests * self.window_pages
        self.num_pages = self.num_ring_pages + cfg.global_max_pages
        shape = (self.num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.v_cache = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        # ring pages of each slot, host copy for the scheduler, device copy for the kernels
        self.ring_pages_np = np.full((cfg.max_requests, self.window_pages), -1, dtype=np.int32)
        self.ring_pages_gpu = torch.full((cfg.max_requests, self.window_pages), -1, dtype=torch.int32, device=device)
        self.seq_lens_np = np.zeros(cfg.max_requests, dtype=np.int64)
        self._pages_used_gpu = torch.zeros(cfg.max_requests, dtype=torch.int32, device=device)
        # global layers: append-only runs
        self.global_runs: Dict[int, List[int]] = {}
        self.free_slots: List[int] = list(range(cfg.max_requests - 1, -1, -1))
        self.free_ring_pages: List[int] = list(range(self.num_ring_pages - 1, -1, -1))
        self.free_global_pages: List[int] = list(range(self.num_pages - 1, self.num_ring_pages - 1, -1))
        self.on_evict: Optional[Callable[[int], None]] = None

    @property
    def pages_used_gpu(self) -> torch.Tensor:
        return self._pages_used_gpu

    def layer(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.k_cache[layer_id], self.v_cache[layer_id]

    def add_request(self, rid: str, prompt_len: int) -> int:
        assert prompt_len > 0, "empty prompt"  # expect: FC109
        slot = self.free_slots.pop()
        pages = self._reserve(self.window_pages)
        self.ring_pages_np[slot] = pages
        self.ring_pages_gpu[slot].copy_(torch.tensor(pages, dtype=torch.int32), non_blocking=True)
        self.seq_lens_np[slot] = prompt_len
        n_pages = -(-prompt_len // self.page_size)
        self._pages_used_gpu[slot] = min(self.window_pages, n_pages)
        self.global_runs[slot] = [self.free_global_pages.pop() for _ in range(n_pages)]
        return slot

    def _reserve(self, n: int) -> List[int]:
        assert n <= len(self.free_ring_pages)  # ok: FC109
        return [self.free_ring_pages.pop() for _ in range(n)]

    def release(self, slot: int) -> None:
        self.free_ring_pages.extend(int(p) for p in self.ring_pages_np[slot])
        self.free_global_pages.extend(self.global_runs.pop(slot, []))
        self.ring_pages_np[slot] = -1
        self.seq_lens_np[slot] = 0
        self.free_slots.append(slot)
        if self.on_evict is not None:
            self.on_evict(slot)

    def advance(self, slots_np: np.ndarray) -> np.ndarray:
        """One decoded token per slot; returns the host mask of rings whose new page overwrote their oldest."""
        lens = self.seq_lens_np[slots_np] + 1
        self.seq_lens_np[slots_np] = lens
        starts_page = (lens - 1) % self.page_size == 0
        wrapped = starts_page & ((lens - 1) // self.page_size >= self.window_pages)
        grew = starts_page & ~wrapped
        for slot in slots_np[starts_page]:
            self.global_runs[int(slot)].append(self.free_global_pages.pop())
        if grew.any():
            used_np = np.minimum(-(-lens[grew] // self.page_size), self.window_pages).astype(np.int32)
            idx = torch.tensor(slots_np[grew], dtype=torch.int64).to(self.device, non_blocking=True)
            self._pages_used_gpu.index_copy_(0, idx, stage_like(torch.tensor(used_np), self._pages_used_gpu))
        return wrapped

    def ring_heads_np(self, slots_np: np.ndarray) -> np.ndarray:
        """Ring slot of the newest page of each request."""
        return ((self.seq_lens_np[slots_np] - 1) // self.page_size) % self.window_pages

    def build_host_table(self, slots_np: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indptr, indices oldest-first, last_page_len) for the ring layers, on the host."""
        lens = self.seq_lens_np[slots_np]
        total_pages = -(-lens // self.page_size)
        used = np.minimum(total_pages, self.window_pages)
        heads = self.ring_heads_np(slots_np)
        indptr = np.zeros(len(slots_np) + 1, dtype=np.int32)
        np.cumsum(used, out=indptr[1:])
        indices = np.empty(int(indptr[-1]), dtype=np.int32)
        for row, slot in enumerate(slots_np):
            n = int(used[row])
            order = (heads[row] - n + 1 + np.arange(n)) % self.window_pages
            indices[indptr[row] : indptr[row + 1]] = self.ring_pages_np[slot, order]
        last = ((lens - 1) % self.page_size + 1).astype(np.int32)
        return indptr, indices, last

    def wrapped_positions(self, slots_np: np.ndarray, wrapped_np: np.ndarray) -> Tuple[torch.Tensor, torch.Tensor]:
        """Where each wrapped row's newest page sits in the packed decode indices, and its page id."""
        rows = np.flatnonzero(wrapped_np)
        flat_np = (rows + 1) * self.window_pages - 1
        slots = slots_np[rows]
        heads = self.ring_heads_np(slots)
        flat_pos = torch.tensor(flat_np, dtype=torch.int64).to(self.device, non_blocking=True)
        slot_t = torch.tensor(slots, dtype=torch.int64).to(self.device, non_blocking=True)
        head_t = torch.tensor(heads, dtype=torch.int64).to(self.device, non_blocking=True)
        return flat_pos, self.ring_pages_gpu[slot_t, head_t]

    def write_decode(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor) -> None:
        self.k_cache[layer_id].flatten(0, 1).index_copy_(0, out_loc, k)
        self.v_cache[layer_id].flatten(0, 1).index_copy_(0, out_loc, v)

    def debug_snapshot(self) -> Dict[str, list]:
        """Dumped by the admin endpoint when a request's output looks wrong."""
        return {
            "ring_pages": self.ring_pages_gpu.cpu().tolist(),  # ok: FC101
            "seq_lens": self.seq_lens_np.tolist(),
        }
