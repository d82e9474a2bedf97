import functools
import logging
from typing import Dict

import numpy as np
import torch
from flashinfer import (BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
                        BatchPrefillWithRaggedKVCacheWrapper)

from ttscore.config import TTSConfig

from .buffers import TextGraphBuffers

logger = logging.getLogger(__name__)


class TextAttention:
    """Paged attention of the text/semantic backbone: prompt prefill, eager and graph decode."""

    def __init__(self, cfg: TTSConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.workspace = torch.empty(cfg.text_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.text_decode = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True)
        self._plan_text = functools.partial(
            self.text_decode.plan,
            num_qo_heads=cfg.text_heads, num_kv_heads=cfg.text_kv_heads, head_dim=cfg.head_dim,
            page_size=cfg.page_size,
        )
        self.bufs = TextGraphBuffers.allocate(cfg.max_streams, cfg.num_pages, device)
        self.kv_last_page_len_device = torch.ones(cfg.max_streams, dtype=torch.int32, device=device)
        self.text_graph: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def init_text_graphs(self, graph_ws: torch.Tensor) -> None:
        for bs in self.cfg.stream_buckets:
            self.text_graph[bs] = BatchDecodeWithPagedKVCacheWrapper(
                graph_ws, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.bufs.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.bufs.kv_indices,
                paged_kv_last_page_len_buffer=self.bufs.kv_last_page_len[:bs],
            )

    def plan_eager_decode(self, kv_indptr_host: torch.Tensor, kv_indices: torch.Tensor, last_np: np.ndarray) -> None:
        n = last_np.shape[0]
        self.kv_last_page_len_device[:n].copy_(torch.from_numpy(last_np), non_blocking=True)
        self._plan_text(kv_indptr_host, kv_indices, self.kv_last_page_len_device[:n])  # expect: FC102

    def plan_graph_decode(self, bs: int, padded: int, kv_indptr_np: np.ndarray, kv_indices: torch.Tensor,
                          last_np: np.ndarray) -> None:
        b = self.bufs
        b.kv_indptr_cpu[: bs + 1].copy_(torch.from_numpy(kv_indptr_np))
        b.kv_indptr_cpu[bs + 1 : padded + 1] = int(kv_indptr_np[-1])
        b.kv_last_page_len_cpu[:bs].copy_(torch.from_numpy(last_np))
        b.kv_indptr[: padded + 1].copy_(b.kv_indptr_cpu[: padded + 1], non_blocking=True)  # ok: FC104
        n = kv_indices.shape[0]
        b.kv_indices[:n].copy_(kv_indices, non_blocking=True)
        self.text_graph[padded].plan(  # ok: FC102
            b.kv_indptr_cpu[: padded + 1], b.kv_indices, b.kv_last_page_len_cpu[:padded],
            self.cfg.text_heads, self.cfg.text_kv_heads, self.cfg.head_dim, self.cfg.page_size,
        )
        b.kv_indices[n : n + (padded - bs)].zero_()  # expect: FC104

    def decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        w = self.text_graph.get(bs) or self.text_decode
        return w.run(q, kv_cache)  # ok: FC108


class DepthAttention:
    """Causal attention inside one audio frame: a ragged sequence of num_codebooks tokens per stream."""

    DEPTH_WS_BYTES = 32 << 20

    def __init__(self, cfg: TTSConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "NHD"  # ok: FC103
        self.depth_ws = torch.empty(self.DEPTH_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        k = cfg.num_codebooks
        self.frame_indptr_gpu = torch.arange(0, (cfg.max_streams + 1) * k, k, dtype=torch.int32, device=device)
        self.frame_indptr_host = torch.arange(0, (cfg.max_streams + 1) * k, k, dtype=torch.int32)
        self.frame_qo_indptr_buf = torch.zeros(cfg.max_streams + 1, dtype=torch.int32, device=device)
        self.frame_kv_indptr_buf = torch.zeros(cfg.max_streams + 1, dtype=torch.int32, device=device)
        self.depth_positions = torch.zeros(cfg.max_streams * k, dtype=torch.int64, device=device)
        self.depth_eager = BatchPrefillWithRaggedKVCacheWrapper(self.depth_ws, self._kv_layout)
        self.depth_graph: Dict[int, BatchPrefillWithRaggedKVCacheWrapper] = {}

    def init_depth_graphs(self) -> None:
        for bs in self.cfg.stream_buckets:
            self.depth_graph[bs] = BatchPrefillWithRaggedKVCacheWrapper(
                self.depth_ws, "NHD", use_cuda_graph=True,
                qo_indptr_buf=self.frame_qo_indptr_buf[: bs + 1],
                kv_indptr_buf=self.frame_kv_indptr_buf[: bs + 1],
            )

    def plan_frame(self, n_streams: int) -> None:
        c = self.cfg
        self.depth_eager.plan(  # expect: FC102
            qo_indptr=self.frame_indptr_gpu[: n_streams + 1], kv_indptr=self.frame_indptr_gpu[: n_streams + 1],
            num_qo_heads=c.depth_heads, num_kv_heads=c.depth_heads, head_dim_qk=c.depth_head_dim, causal=True,
        )

    def plan_frame_graph(self, bs: int) -> None:
        c = self.cfg
        self.depth_graph[bs].plan(  # ok: FC102
            qo_indptr=self.frame_indptr_host[: bs + 1], kv_indptr=self.frame_indptr_host[: bs + 1],
            num_qo_heads=c.depth_heads, num_kv_heads=c.depth_heads, head_dim_qk=c.depth_head_dim, causal=True,
        )

    def run_frame(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.depth_eager.run(q, k, v)  # expect: FC108

    def run_frame_graph(self, bs: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.depth_graph[bs].run(q, k, v)


def kernels_loaded(wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper]) -> bool:
    return all(hasattr(w, "_cached_module") for w in wrappers.values())  # expect: FC103
