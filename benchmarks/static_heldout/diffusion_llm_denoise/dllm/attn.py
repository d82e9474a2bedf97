"""Bidirectional block attention.

The block being denoised attends, without a causal mask, to the committed
prefix (paged, from the prefix cache) and to itself (ragged: the block's K/V are
recomputed every step and only written to the cache when the block commits).
The two partial results are merged by their LSE.  Each denoising step replans
both halves; graph replays use one paged prefix wrapper per (batch, block length).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper, merge_state

from dllm.config import AttnLimits, DLLMConfig
from dllm.prefix_cache import PrefixKVCache

GraphKey = Tuple[int, int]


class BidirBlockAttention:
    def __init__(self, cfg: DLLMConfig, limits: AttnLimits, cache: PrefixKVCache, device: torch.device):
        self.cfg = cfg
        self.cache = cache
        self.device = device
        H, D = cfg.num_qo_heads, cfg.head_dim
        max_bs, max_len = max(cfg.graph_bs), max(cfg.block_lens)
        self.prefix_ws = torch.empty(limits.prefill_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        block_ws_bytes = max_bs * max_len * H * (D + 1) * 4 * 8
        self.block_ws = torch.empty(block_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.graph_ws = torch.zeros(limits.graph_ws_bytes, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefix_ws, "NHD", backend="fa2")
        self.block_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.block_ws, "NHD", backend="fa2")

        self.g_qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.g_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.g_kv_indices = torch.zeros(max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.g_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.graph_bufs = {
            "qo_indptr": self.g_qo_indptr,
            "kv_indptr": self.g_kv_indptr,
            "kv_indices": self.g_kv_indices,
            "last_page_len": self.g_last_page_len,
        }
        self.qo_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[GraphKey, BatchPrefillWithPagedKVCacheWrapper] = {}

    def _dims(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def init_graph_buffers(self, keys: List[GraphKey]) -> None:
        for bs, block_len in keys:
            self.graph_wrappers[(bs, block_len)] = BatchPrefillWithPagedKVCacheWrapper(
                self.graph_ws,
                "NHD",
                use_cuda_graph=True,
                qo_indptr_buf=self.g_qo_indptr[: bs + 1],
                paged_kv_indptr_buf=self.g_kv_indptr[: bs + 1],
                paged_kv_indices_buf=self.g_kv_indices,
                paged_kv_last_page_len_buf=self.g_last_page_len[:bs],
                backend="fa2",
            )
        self.g_last_page_len.fill_(1)  # ok: FC104

    def bind_dummy(self, key: GraphKey) -> None:
        """Warm-up and capture: every request has a one-page prefix."""
        bs, block_len = key
        H, KVH, D, P = self._dims()
        qo = torch.arange(0, (bs + 1) * block_len, block_len, dtype=torch.int32)
        self.graph_wrappers[key].plan(
            qo, torch.arange(bs + 1, dtype=torch.int32), self.g_kv_indices[:bs], torch.ones(bs, dtype=torch.int32),
            H, KVH, D, P, causal=False, q_data_type=self.cfg.dtype,
        )
        self.plan_block_self(bs, block_len)

    def plan_block_self(self, bs: int, block_len: int) -> None:
        H, KVH, D, _ = self._dims()
        block_indptr = torch.arange(0, (bs + 1) * block_len, block_len, dtype=torch.int32)
        self.block_wrapper.plan(
            block_indptr, block_indptr, H, KVH, D, causal=False, q_data_type=self.cfg.dtype
        )

    def plan_denoise_step(self, req_ids: List[int], block_len: int) -> None:
        """Eager path: plan both halves of the block's attention for this denoising step."""
        bs = len(req_ids)
        H, KVH, D, P = self._dims()
        kv_indptr, kv_indices, last_page_len = self.cache.page_table(req_ids)
        qo_indptr = torch.arange(0, (bs + 1) * block_len, block_len, dtype=torch.int32, device=self.device)
        self.prefix_wrapper.plan(  # expect: FC102
            qo_indptr, kv_indptr, kv_indices, last_page_len, H, KVH, D, P, causal=False, q_data_type=self.cfg.dtype
        )
        self.plan_block_self(bs, block_len)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, key: Optional[GraphKey]
    ) -> torch.Tensor:
        prefix = self.graph_wrappers[key] if key is not None else self.prefix_wrapper
        o_prefix, s_prefix = prefix.run(q, self.cache.kv[layer_id], return_lse=True)  # ok: FC108
        o_block, s_block = self.block_wrapper.run(q, k, v, return_lse=True)  # expect: FC108
        out, _ = merge_state(o_prefix, s_prefix, o_block, s_block)
        return out
