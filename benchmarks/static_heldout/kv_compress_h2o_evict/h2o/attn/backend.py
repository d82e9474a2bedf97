"""Decode attention over the compressed page tables.

Graph-mode ``CUDAGraphBatchDecodeWithPagedKVCacheWrapper``s (one per batch bucket) are bound positionally to this
backend's indptr / indices / last-page buffers; a tensor-core decode wrapper computes the log-sum-exp that turns
per-page key summaries into the attention mass H2O accumulates; batches past the largest bucket run trtllm-gen.
"""

from __future__ import annotations

from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer import CUDAGraphBatchDecodeWithPagedKVCacheWrapper, trtllm_batch_decode_with_kv_cache

from h2o.kv.page_pool import CompressedPagePool
from h2o.policy.budget import _WS_TIERS, PAGE_SIZE, EvictionBudget

_TRTLLM_WS = None
_WS_FIELDS = ("_int_workspace_buffer", "_float_workspace_buffer")


def _trtllm_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    global _TRTLLM_WS
    if _TRTLLM_WS is None:
        _TRTLLM_WS = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    return _TRTLLM_WS


class H2OAttention:
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, max_batch: int, budget: EvictionBudget, pool: CompressedPagePool, device: torch.device):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.max_batch = max_batch
        self.pool = pool
        self.device = device
        self.sm_scale = head_dim ** -0.5
        P = budget.max_pages + 1
        self.page_indptr = torch.zeros(max_batch + 1, dtype=torch.int32, device=device)
        self.page_indices = torch.zeros(max_batch * P, dtype=torch.int32, device=device)
        self.last_page_len = torch.ones(max_batch, dtype=torch.int32, device=device)
        self.planned_indptr_host = torch.zeros(max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.planned_last_host = torch.ones(max_batch, dtype=torch.int32, pin_memory=True)
        self.page_scores = torch.zeros((max_batch, P), dtype=torch.float32, device=device)
        self.block_tables = torch.zeros((max_batch, P), dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(max_batch, dtype=torch.int32, device=device)
        self.trtllm_bytes = max_batch * num_heads * (head_dim + 2) * 4 * 16
        ws_bytes = max_batch * num_heads * (head_dim + 1) * 4 * 8
        self.graph_workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill_workspace = torch.zeros(_WS_TIERS["prefill"], dtype=torch.uint8, device=device)  # expect: FC106
        layout = self.pool._kv_layout  # ok: FC103
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.graph_workspace, layout)
        self.score_decode = BatchDecodeWithPagedKVCacheWrapper(self.graph_workspace, layout, use_tensor_cores=True)
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, layout)
        self.graph_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}

    def build_graph_wrappers(self, buckets) -> None:
        for bs in buckets:
            self.graph_wrappers[bs] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, self.page_indptr[: bs + 1], self.page_indices, self.last_page_len[:bs], "NHD"
            )

    def memory_report(self) -> Dict[str, int]:
        total: Dict[str, int] = {}
        for bs, w in self.graph_wrappers.items():
            for name in _WS_FIELDS:
                buf = getattr(w, name, None)  # expect: FC103
                if buf is not None:
                    total[f"{bs}:{name}"] = buf.numel() * buf.element_size()
        return total

    # ------------------------------------------------------------------ per-step preparation
    def prepare_decode(self, bs: int, bucket: int) -> None:
        pool = self.pool
        n = int(pool.page_indptr_host[bs])
        self.page_indices[:n].copy_(pool.page_indices[:n], non_blocking=True)  # ok: FC104
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        if bucket:
            pool.page_indptr_host[bs + 1 : bucket + 1] = n
            pool.last_page_len_host[bs:bucket] = 1
            self.graph_wrappers[bucket].plan(pool.page_indptr_host[: bucket + 1], self.page_indices, pool.last_page_len_host[:bucket], H, KVH, D, PAGE_SIZE)  # ok: FC102
        else:
            self.eager_decode.plan(pool.page_indptr[: bs + 1], pool.page_indices, pool.last_page_len[:bs], H, KVH, D, PAGE_SIZE)  # expect: FC102
        self.score_decode.plan(pool.page_indptr_host[: bs + 1], pool.page_indices, pool.last_page_len_host[:bs], H, KVH, D, PAGE_SIZE)
        # snapshot what was planned for the eviction auditor (it reads the copies after the step's event)
        for dev, host in zip((self.page_indptr, self.last_page_len), (self.planned_indptr_host, self.planned_last_host)):
            host.copy_(dev, non_blocking=True)  # ok: FC104

    # ------------------------------------------------------------------ kernels
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bucket: int) -> torch.Tensor:
        wrapper = self.graph_wrappers[bucket] if bucket else self.eager_decode
        return wrapper.run(q, kv_cache)  # ok: FC108

    def score_pages(self, q: torch.Tensor, kv_cache: torch.Tensor, key_means: torch.Tensor, bs: int) -> None:
        """Attention mass of every page: exp(q . mean_k * scale + log(page_size) - lse), summed over heads."""
        _, lse = self.score_decode.run_return_lse(q, kv_cache)  # expect: FC108
        logits = torch.einsum("bhd,bphd->bp", q.float(), key_means.float()) * self.sm_scale
        mass = torch.exp(logits + torch.log(torch.tensor(float(PAGE_SIZE))) - lse.float().logsumexp(-1, keepdim=True))
        self.page_scores[:bs, : mass.shape[1]].copy_(mass)

    def forward_large(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int, max_len: int) -> torch.Tensor:
        ws = _trtllm_workspace(self.trtllm_bytes, self.device)
        return trtllm_batch_decode_with_kv_cache(
            q, kv_cache, ws, self.block_tables[:bs], self.seq_lens[:bs], max_len, bmm1_scale=self.sm_scale, bmm2_scale=1.0
        )
