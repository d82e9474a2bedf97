"""Attention for the MoE model: graph-mode FA2 decode per bucket, a trtllm-gen eager decode,
an FA2 prefill and the MTP head's decode wrapper."""
from __future__ import annotations

from typing import Dict, List

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from nvmoe import MoEConfig
from nm_attn.batch import StepBatch

_WS_MB = {"graph": 256, "mtp": 64}


class MoEAttentionBackend:
    def __init__(self, cfg: MoEConfig, kv_cache: torch.Tensor, device: torch.device):
        self.cfg, self.kv_cache, self.device = cfg, kv_cache, device
        max_bs = cfg.max_batch_size
        max_pages = max_bs * cfg.max_pages_per_seq
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.kv_last_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.k_scale = torch.ones((), dtype=torch.float32, device=device)  # FP8 KV scale, calibrated online
        self.heads = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)

        self.graph_ws = torch.zeros(_WS_MB["graph"] << 20, dtype=torch.uint8, device=device)  # expect: FC106
        prefill_bytes = cfg.max_num_tokens * cfg.num_qo_heads * cfg.head_dim * 8 + (32 << 20)
        self.prefill_ws = torch.empty(prefill_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.eager_ws = self._eager_workspace()
        self.decode_backend = {"graph": "fa2", "eager": "trtllm-gen"}
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "HND",
                                                               backend=self.decode_backend["eager"])
        self.mtp_decode = BatchDecodeWithPagedKVCacheWrapper(self.graph_ws, "HND", use_tensor_cores=True)
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "HND")

    def _eager_workspace(self) -> torch.Tensor:
        c = self.cfg
        ws = torch.empty(c.max_batch_size * c.num_qo_heads * c.head_dim * 64 + (16 << 20),  # ok: FC105
                         dtype=torch.uint8, device=self.device)
        ws.zero_()
        return ws

    def init_graph_wrappers(self, buckets: List[int]) -> None:
        for bs in buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "HND", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs], backend=self.decode_backend["graph"])

    def memory_report(self) -> Dict[str, int]:
        return {
            "graph_int_ws": sum(w._int_workspace_buffer.numel() for w in self.graph_wrappers.values()),  # expect: FC103
            "graph_float_ws": self.graph_ws.numel(),
            "eager_ws": self.eager_ws.numel(),
        }

    def _fill_host(self, rows: int, page_lists: List[List[int]], seq_lens_np: np.ndarray) -> int:
        n = len(page_lists)
        counts = np.zeros(rows, dtype=np.int32)
        counts[:n] = [len(p) for p in page_lists]
        indptr = self.kv_indptr_cpu.numpy()
        indptr[0] = 0
        np.cumsum(counts, out=indptr[1 : rows + 1])
        total = int(indptr[rows])
        if total:
            self.kv_indices_cpu.numpy()[:total] = np.concatenate([np.asarray(p, dtype=np.int32) for p in page_lists])
        last = self.kv_last_cpu.numpy()
        last[:rows] = 1
        last[:n] = (seq_lens_np[:n] - 1) % self.cfg.page_size + 1
        return total

    def prepare_bucket(self, bs: int, padded: int, page_lists: List[List[int]], seq_lens_np: np.ndarray) -> None:
        total = self._fill_host(padded, page_lists, seq_lens_np)
        self.kv_indices[:total].copy_(self.kv_indices_cpu[:total], non_blocking=True)  # ok: FC104
        self.graph_wrappers[padded].plan(  # ok: FC102
            self.kv_indptr_cpu[: padded + 1], self.kv_indices[:total], self.kv_last_cpu[:padded], *self.heads)
        self.mtp_decode.plan(self.kv_indptr_cpu[: padded + 1], self.kv_indices[:total], self.kv_last_cpu[:padded],
                             *self.heads)

    def plan_eager(self, batch: StepBatch) -> None:
        bs = batch.batch_size
        total = self._fill_host(bs, batch.page_lists, batch.seq_lens_np)
        self.eager_decode.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.kv_indices_cpu[:total], self.kv_last_cpu[:bs], *self.heads)

    def plan_prefill(self, batch: StepBatch) -> None:
        self.prefill.plan(  # expect: FC102
            batch.cu_seqlens_gpu, batch.kv_indptr_host, batch.kv_indices, batch.kv_last_host,
            *self.heads[:3], self.cfg.page_size, causal=True)

    def forward_decode(self, q: torch.Tensor, layer: int, bs: int) -> torch.Tensor:
        return self.graph_wrappers[bs].run(q, self.kv_cache[layer])  # ok: FC108

    def forward_decode_eager(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        return self.eager_decode.run(q, self.kv_cache[layer])

    def forward_prefill(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        return self.prefill.run(q, self.kv_cache[layer])

    def forward_mtp(self, q: torch.Tensor) -> torch.Tensor:
        # the MTP head attends over the last layer's cache
        return self.mtp_decode.run(q, self.kv_cache[-1])  # expect: FC108
