from __future__ import annotations

import logging
import os
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, merge_state
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

logger = logging.getLogger(__name__)

HOT_DECODE_WS = int(os.environ.get("HOTKV_WS_BYTES", 192 << 20))


class HotPageAttnBackend:
    """Decode attention over GPU hot-page slots, plus the GPU-only ring of not-yet-offloaded tokens."""

    def __init__(self, num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, num_slots: int,
                 max_bs: int, max_hot_pages: int, ring_pages: int, device: torch.device,
                 use_trtllm_long: bool = False):
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.page_size = page_size
        self.max_bs = max_bs
        self.device = device
        self.graph_bs: Optional[int] = None

        self.workspace = torch.empty(HOT_DECODE_WS, dtype=torch.uint8, device=device)  # expect: FC106
        ring_ws = torch.empty(max_bs * ring_pages * num_qo_heads * 512, dtype=torch.uint8, device=device)  # ok: FC105
        ring_ws.zero_()
        self.trtllm_ws = None
        if use_trtllm_long:
            self.trtllm_ws = torch.empty(max_bs * num_qo_heads * 8192, dtype=torch.uint8, device=device)  # expect: FC105

        cap = max_bs * max_hot_pages
        self.hot_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.hot_indices = torch.zeros(cap, dtype=torch.int32, device=device)
        self.hot_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.hot_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.hot_indptr_np = self.hot_indptr_cpu.numpy()
        self.hot_indices_cpu = torch.zeros(cap, dtype=torch.int32, pin_memory=True)
        self.full_last_cpu = torch.full((max_bs,), page_size, dtype=torch.int32, pin_memory=True)
        self.hot_counts = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.seq_lens_gpu = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.sel_indptr_gpu = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_bs, max_hot_pages, dtype=torch.int32, device=device)

        self.ring_indptr_cpu = torch.arange(0, (max_bs + 1) * ring_pages, ring_pages, dtype=torch.int32)
        self.ring_indices = torch.arange(max_bs * ring_pages, dtype=torch.int32, device=device)
        self.ring_last_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True)
        self.ring_decode = BatchDecodeWithPagedKVCacheWrapper(ring_ws, "NHD", backend="trtllm-gen")
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    # ---- set-up -------------------------------------------------------------------------------
    def init_graph_buffers(self) -> None:
        self.hot_indptr.zero_()
        self.hot_last_page_len.fill_(self.page_size)  # ok: FC104

    def make_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
            paged_kv_indptr_buffer=self.hot_indptr[: bs + 1],
            paged_kv_indices_buffer=self.hot_indices,
            paged_kv_last_page_len_buffer=self.hot_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = w
        return w

    def hot_capacity(self, bs: int) -> int:
        return self.graph_wrappers[bs]._paged_kv_indices_buf.numel()  # expect: FC103

    def _plan_ring(self, bs: int, ring_last_np: np.ndarray) -> None:
        self.ring_last_cpu[:bs] = torch.from_numpy(ring_last_np)
        self.ring_decode.plan(self.ring_indptr_cpu[: bs + 1], self.ring_indices, self.ring_last_cpu[:bs],  # ok: FC102
                              self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size)

    # ---- per step -----------------------------------------------------------------------------
    def plan_eager(self, slot_rows: List[np.ndarray], ring_last_np: np.ndarray) -> None:
        self.graph_bs = None
        bs = len(slot_rows)
        counts = torch.from_numpy(np.asarray([len(r) for r in slot_rows], dtype=np.int32))
        torch.cumsum(counts.to(self.device, non_blocking=True), 0, out=self.sel_indptr_gpu[1 : bs + 1])
        flat = torch.from_numpy(np.concatenate(slot_rows).astype(np.int32)).to(self.device, non_blocking=True)
        self.eager_decode.plan(self.sel_indptr_gpu[: bs + 1], flat, self.full_last_cpu[:bs],  # expect: FC102
                               self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size)
        self._plan_ring(bs, ring_last_np)

    def prepare_hot_replay(self, bs: int, slot_rows: List[np.ndarray], ring_last_np: np.ndarray) -> None:
        self.graph_bs = bs
        self._plan_ring(bs, ring_last_np)
        max_hot = self.hot_counts[:bs].max().item()  # expect: FC101
        if max_hot * bs > self.hot_capacity(bs):
            raise RuntimeError(f"selection of {max_hot} pages per row exceeds the graph's index buffer")
        n = len(slot_rows)
        self.hot_indptr_np[0] = 0
        np.cumsum([len(r) for r in slot_rows], out=self.hot_indptr_np[1 : n + 1])
        self.hot_indptr_np[n + 1 : bs + 1] = self.hot_indptr_np[n]
        total = int(self.hot_indptr_np[bs])
        self.hot_indices_cpu[:total] = torch.from_numpy(np.concatenate(slot_rows).astype(np.int32))
        self.hot_indices[:total].copy_(self.hot_indices_cpu[:total], non_blocking=True)  # ok: FC104
        last = (self.seq_lens_gpu[:bs] - 1) % self.page_size + 1
        self.graph_wrappers[bs].plan(self.hot_indptr_cpu[: bs + 1], self.hot_indices[:total], last,  # expect: FC102
                                     self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size)
        self.hot_indptr_cpu[bs + 1 :] = total  # ok: FC104
        self.hot_last_page_len[:bs].copy_(last)  # expect: FC104

    # ---- forward ------------------------------------------------------------------------------
    def forward_decode(self, q: torch.Tensor, hot_kv: torch.Tensor, ring_kv: torch.Tensor, bs: int) -> torch.Tensor:
        if self.trtllm_ws is not None and self.graph_bs is None:
            return trtllm_batch_decode_with_kv_cache(q, hot_kv, self.trtllm_ws, self.block_tables[:bs],
                                                     self.seq_lens_gpu[:bs], 1 << 20)
        w = self.graph_wrappers.get(bs) if self.graph_bs is not None else self.eager_decode
        out, lse = w.run(q, hot_kv, return_lse=True)  # ok: FC108
        r_out, r_lse = self.ring_decode.run(q, ring_kv, return_lse=True)  # expect: FC108
        out, _ = merge_state(out, lse, r_out, r_lse)
        return out
