"""Decode-side attention for the disaggregated decode worker: graph-mode wrappers per batch size, with a
separate set for the sliding-window layers."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Dict

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

logger = logging.getLogger(__name__)


@dataclass
class DecodeBackendConfig:
    max_bs: int
    max_pages_per_req: int
    page_size: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int = 0
    use_trtllm_gen: bool = False


class DecodeAttnBackend:
    def __init__(self, cfg: DecodeBackendConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        ws_bytes = int(os.environ.get("DSERVE_DECODE_WORKSPACE_MB", "256")) * 1024 * 1024
        self.workspace_buffer = torch.empty(ws_bytes, dtype=torch.uint8, device=device)  # expect: FC105, FC106
        max_bs = cfg.max_bs
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.swa_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.swa_kv_indices = torch.zeros(max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.eager_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, "NHD")
        self.graph_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        self.swa_graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def init_cuda_graph_wrappers(self, bs: int) -> None:
        self.graph_wrappers[bs] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            self.workspace_buffer, self.kv_indptr[: bs + 1], self.kv_indices, self.kv_last_page_len[:bs], "NHD"
        )
        if self.cfg.sliding_window > 0:
            self.swa_graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace_buffer,
                "NHD",
                paged_kv_indptr_buffer=self.swa_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.swa_kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    def init_forward_metadata(self, seq_lens: torch.Tensor, kv_indices: torch.Tensor) -> None:
        bs = seq_lens.shape[0]
        kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        kv_indptr[1:] = torch.cumsum((seq_lens + self.page_size - 1) // self.page_size, 0)
        self.eager_wrapper.plan(  # expect: FC102
            kv_indptr,
            kv_indices,
            self.kv_last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.page_size,
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, seq_lens_cpu: torch.Tensor, page_table_np: np.ndarray) -> None:
        num_pages = (seq_lens_cpu[:bs].numpy() + self.page_size - 1) // self.page_size
        indptr_np = self.kv_indptr_cpu.numpy()
        np.cumsum(num_pages, out=indptr_np[1 : bs + 1])
        total = int(indptr_np[bs])
        flat = np.concatenate([page_table_np[i, : num_pages[i]] for i in range(bs)])
        self.kv_indices[:total].copy_(torch.from_numpy(flat), non_blocking=True)  # ok: FC104
        last = seq_lens_cpu[:bs] % self.page_size
        self.kv_last_page_len_cpu[:bs] = torch.where(last == 0, self.page_size, last)
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices[:total],
            self.kv_last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.page_size,
        )
        if bs in self.swa_graph_wrappers:
            self.swa_kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)
            self.swa_graph_wrappers[bs].plan(
                self.kv_indptr_cpu[: bs + 1],
                self.swa_kv_indices,
                self.kv_last_page_len_cpu[:bs],
                self.cfg.num_qo_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                self.page_size,
                window_left=self.cfg.sliding_window,
            )

    def forward_decode_graph(self, q: torch.Tensor, kv_cache: torch.Tensor, sliding_window: int, bs: int) -> torch.Tensor:
        if sliding_window > 0:
            return self.swa_graph_wrappers[bs].run(q, kv_cache)  # expect: FC108
        return self.graph_wrappers[bs].run(q, kv_cache)  # ok: FC108

    def forward_decode_trtllm(self, q, kv_cache, block_tables, seq_lens, max_seq_len: int, scale: float) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.workspace_buffer,
            block_tables=block_tables,
            seq_lens=seq_lens,
            max_seq_len=max_seq_len,
            bmm1_scale=scale,
            bmm2_scale=1.0,
        )


class DecodeGraphRunner:
    def __init__(self, backend: DecodeAttnBackend, layers, kv_caches, capture_bs, hidden_size: int, dtype=torch.bfloat16):
        self.backend = backend
        self.layers = layers
        self.kv_caches = kv_caches
        self.capture_bs = sorted(capture_bs)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        cfg = backend.cfg
        self.q = torch.zeros(max(self.capture_bs), cfg.num_qo_heads, cfg.head_dim, dtype=dtype, device=backend.device)

    def _forward(self, bs: int) -> torch.Tensor:
        q = self.q[:bs]
        for layer, kv_cache in zip(self.layers, self.kv_caches):
            q = self.backend.forward_decode_graph(q, kv_cache, layer.sliding_window, bs)
        return q

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.backend.init_cuda_graph_wrappers(bs)
            self.backend.init_forward_metadata_replay_cuda_graph(
                bs, torch.ones(bs, dtype=torch.int32), np.zeros((bs, 1), dtype=np.int32)
            )
            self._forward(bs)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.outputs[bs] = self._forward(bs)
            self.graphs[bs] = graph

    def replay(self, bs: int, q: torch.Tensor, seq_lens_cpu: torch.Tensor, page_table_np: np.ndarray) -> torch.Tensor:
        self.q[:bs].copy_(q)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, seq_lens_cpu, page_table_np)
        self.graphs[bs].replay()
        return self.outputs[bs]
