"""FlashInfer decode for the seeded server: graph wrappers per bucket, eager and cascade paths."""

from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)

from seedserve.batch import DecodeBatch
from seedserve.config import ServeConfig
from seedserve.kv import PagedKV


class SeededAttnBackend:
    def __init__(self, cfg: ServeConfig, kv: PagedKV, device: torch.device):
        self.cfg = cfg
        self.kv = kv
        self.device = device
        self.dtype = getattr(torch, cfg.dtype)
        sm_major = torch.cuda.get_device_capability(device)[0]
        self.decode_backend = "trtllm-gen" if sm_major >= 10 else "fa2"
        self.cascade_enabled = cfg.share_prompt_pages

        self.eager_ws = torch.empty(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.prefill_ws = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.cascade_ws = torch.zeros(cfg.cascade_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "HND", backend=self.decode_backend)
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "HND")
        self.cascade = MultiLevelCascadeAttentionWrapper(2, self.cascade_ws, "HND")

        max_bs, max_pages = cfg.max_batch_size, cfg.max_pages_per_request
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_ws: Optional[torch.Tensor] = None
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def _dims(self):
        c = self.cfg
        return c.num_heads, c.num_kv_heads, c.head_dim, c.page_size

    # ----------------------------------------------------------------- set-up
    def init_graph_buffers(self, batch_sizes: List[int]) -> None:
        ws_bytes = int(os.getenv("SEEDSERVE_GRAPH_WS_MB", "256")) << 20
        self.graph_ws = torch.zeros(ws_bytes, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.kv_last_page_len.fill_(1)  # ok: FC104
        for bs in batch_sizes:
            self.graph_decode[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws,
                "HND",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    # ------------------------------------------------------------ eager decode
    def init_forward_metadata(self, fb: DecodeBatch) -> None:
        h, kvh, d, ps = self._dims()
        self.eager_decode.plan(  # expect: FC102
            fb.kv_indptr,
            fb.kv_indices,
            fb.kv_last_page_len_cpu,
            h,
            kvh,
            d,
            ps,
            q_data_type=self.dtype,
        )
        if self.cascade_enabled:
            self._plan_cascade(fb)

    def _plan_cascade(self, fb: DecodeBatch) -> None:
        """Level 0: the prompt pages every sibling of a group shares; level 1: own pages."""
        h, kvh, d, ps = self._dims()
        groups: Dict[int, List[int]] = {}
        for i, r in enumerate(fb.reqs):
            groups.setdefault(r.group if r.group >= 0 else -(i + 1), []).append(i)
        order = [i for rows in groups.values() for i in rows]
        qo0 = np.zeros(len(groups) + 1, dtype=np.int32)
        np.cumsum([len(rows) for rows in groups.values()], out=qo0[1:])
        shared = [fb.reqs[rows[0]].pages[: len(fb.reqs[rows[0]].prompt_ids) // ps] for rows in groups.values()]
        kv0 = np.zeros(len(groups) + 1, dtype=np.int32)
        np.cumsum([len(s) for s in shared], out=kv0[1:])
        idx0 = np.array([p for s in shared for p in s], dtype=np.int32)
        last0 = np.full(len(groups), ps, dtype=np.int32)
        own = [fb.reqs[i].pages[len(shared[g]):] for g, rows in enumerate(groups.values()) for i in rows]
        qo1 = np.arange(len(order) + 1, dtype=np.int32)
        kv1 = np.zeros(len(order) + 1, dtype=np.int32)
        np.cumsum([len(o) for o in own], out=kv1[1:])
        idx1 = np.array([p for o in own for p in o], dtype=np.int32)
        last1 = fb.kv_last_page_len_cpu.numpy()[order]
        self.cascade.plan(  # ok: FC102
            [torch.from_numpy(qo0), torch.from_numpy(qo1)],
            [torch.from_numpy(kv0), torch.from_numpy(kv1)],
            [torch.from_numpy(idx0).to(self.device), torch.from_numpy(idx1).to(self.device)],
            [torch.from_numpy(last0), torch.from_numpy(last1)],
            h,
            kvh,
            d,
            ps,
            q_data_type=self.dtype,
        )

    # ------------------------------------------------------------ graph decode
    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: DecodeBatch) -> None:
        h, kvh, d, ps = self._dims()
        fb.graph_bs = bs
        self.kv_indptr_host[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))
        self.kv_last_page_len_host[:bs].fill_(1)
        self.graph_decode[bs].plan(
            self.kv_indptr_host[: bs + 1],
            self.kv_indices[:bs],
            self.kv_last_page_len_host[:bs],
            h,
            kvh,
            d,
            ps,
            q_data_type=self.dtype,
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: DecodeBatch) -> None:
        h, kvh, d, ps = self._dims()
        real = fb.batch_size
        fb.graph_bs = bs
        self.kv_indptr_host[: real + 1].copy_(fb.kv_indptr_cpu)
        self.kv_indptr_host[real + 1 : bs + 1] = fb.kv_indptr_cpu[-1]
        self.kv_last_page_len_host[:real].copy_(fb.kv_last_page_len_cpu)
        nnz = int(fb.kv_indptr_cpu[-1])
        self.kv_indices[:nnz].copy_(fb.kv_indices, non_blocking=True)  # ok: FC104
        self.graph_decode[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.kv_indices[:nnz],
            self.kv_last_page_len_host[:bs],
            h,
            kvh,
            d,
            ps,
            q_data_type=self.dtype,
        )
        # padded rows: one-token dummies (the mirror keeps whatever an earlier batch left)
        self.kv_last_page_len[real:bs].fill_(1)  # expect: FC104

    # ------------------------------------------------------------------ prefill
    def plan_prefill(self, qo_indptr_np: np.ndarray, kv_indptr_np: np.ndarray, indices: torch.Tensor, last_np: np.ndarray) -> None:
        h, kvh, d, ps = self._dims()
        self.prefill.plan(
            torch.from_numpy(qo_indptr_np),
            torch.from_numpy(kv_indptr_np),
            indices,
            torch.from_numpy(last_np),
            h,
            kvh,
            d,
            ps,
            causal=True,
            q_data_type=self.dtype,
        )

    # ------------------------------------------------------------------ forward
    def forward_decode(self, q: torch.Tensor, layer: int, fb: DecodeBatch) -> torch.Tensor:
        kv_cache = self.kv.layers[layer]
        if self.cascade_enabled:
            return self.cascade.run(q, kv_cache)  # expect: FC108
        w = self.graph_decode[fb.graph_bs] if fb.graph_bs is not None else self.eager_decode
        return w.run(q, kv_cache)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        return self.prefill.run(q, self.kv.layers[layer])
