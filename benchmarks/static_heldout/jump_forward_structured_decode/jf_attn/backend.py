"""Attention for jump-forward serving: one paged prefill wrapper for mixed steps, eager and
graph-mode decode wrappers for pure decode steps, trtllm-gen context for long prompts."""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from jf.batch import MixedBatch
from jf.config import WS_MIB, JFConfig
from jf.kv import PagedKVPool, get_context_workspace


class MixedAttnBackend:
    def __init__(self, cfg: JFConfig, pool: PagedKVPool, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self.dtype = getattr(torch, cfg.dtype)
        self.sm_scale = cfg.head_dim**-0.5
        self.use_trtllm_context = torch.cuda.get_device_capability(device)[0] >= 10
        self.mixed_ws = torch.empty(cfg.mixed_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.decode_ws = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.mixed_prefill = BatchPrefillWithPagedKVCacheWrapper(self.mixed_ws, "HND")
        self.decode_eager = BatchDecodeWithPagedKVCacheWrapper(self.decode_ws, "HND", use_tensor_cores=True)
        self.tokens_planned = 0
        self.graph_ws: Optional[torch.Tensor] = None
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.use_graph_for: Optional[int] = None

    def _dims(self):
        c = self.cfg
        return c.num_heads, c.num_kv_heads, c.head_dim, c.page_size

    # ----------------------------------------------------------------- set-up
    def init_graph_buffers(self, batch_sizes: List[int]) -> None:
        max_bs = max(batch_sizes)
        self.graph_ws = torch.zeros(WS_MIB["decode"] << 20, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.graph_kv_indices = torch.zeros(max_bs * self.cfg.max_pages_per_request, dtype=torch.int32, device=self.device)
        self.graph_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.graph_last_page_len.fill_(1)  # ok: FC104
        self.kv_indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        for bs in batch_sizes:
            self.graph_decode[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws,
                "HND",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.graph_kv_indices,
                paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
            )

    # ------------------------------------------------------- per-step planning
    def prepare_step(self, batch: MixedBatch) -> None:
        h, kvh, d, ps = self._dims()
        batch.graph_bs = None
        if batch.is_pure_decode:
            kw = dict(
                indptr=torch.from_numpy(batch.kv_indptr_np),
                indices=batch.kv_indices,
                last_page_len=batch.kv_last_page_len,
                num_qo_heads=h,
                num_kv_heads=kvh,
                head_dim=d,
                page_size=ps,
                q_data_type=self.dtype,
            )
            self.decode_eager.plan(**kw)  # expect: FC102
            return
        num_q = int(batch.qo_indptr[-1])  # expect: FC101
        self.tokens_planned += num_q
        self.mixed_prefill.plan(  # expect: FC102
            batch.qo_indptr,
            torch.from_numpy(batch.kv_indptr_np),
            batch.kv_indices,
            torch.from_numpy(batch.kv_last_page_len_np),
            h,
            kvh,
            d,
            ps,
            causal=True,
            q_data_type=self.dtype,
        )

    def plan_decode_graph(self, bs: int, batch: MixedBatch) -> None:
        h, kvh, d, ps = self._dims()
        real = batch.batch_size
        nnz = int(batch.kv_indptr_np[-1])
        self.kv_indptr_pinned[: real + 1].copy_(torch.from_numpy(batch.kv_indptr_np))
        self.kv_indptr_pinned[real + 1 : bs + 1] = nnz
        self.last_page_len_pinned[:real].copy_(torch.from_numpy(batch.kv_last_page_len_np))
        self.last_page_len_pinned[real:bs] = 1
        batch.graph_bs = bs
        self.graph_decode[bs].plan(  # ok: FC102
            self.kv_indptr_pinned[: bs + 1],
            self.graph_kv_indices[:nnz],
            self.last_page_len_pinned[:bs],
            h,
            kvh,
            d,
            ps,
            q_data_type=self.dtype,
        )

    # ---------------------------------------------------------------- forward
    def forward_decode(self, q: torch.Tensor, layer: int, batch: MixedBatch) -> torch.Tensor:
        w = self.graph_decode[batch.graph_bs] if batch.graph_bs is not None else self.decode_eager
        return w.run(q, self.pool.layers[layer])  # ok: FC108

    def forward_mixed(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        return self.mixed_prefill.run(q, self.pool.layers[layer])  # expect: FC108

    def forward_prompt_trtllm(self, q: torch.Tensor, layer: int, batch: MixedBatch) -> torch.Tensor:
        """New long prompts on Blackwell: trtllm-gen context attention straight from the block table."""
        ws = get_context_workspace(self.cfg.mixed_workspace_bytes(), str(self.device))
        n = batch.batch_size
        max_q = int(np.diff(batch.qo_indptr_np).max())
        return trtllm_batch_context_with_kv_cache(
            query=q,
            kv_cache=self.pool.layers[layer],
            workspace_buffer=ws,
            block_tables=self.pool.block_table[batch.slots],
            seq_lens=batch.seq_lens,
            max_q_len=max_q,
            max_kv_len=self.cfg.max_pages_per_request * self.cfg.page_size,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
            batch_size=n,
            cum_seq_lens_q=batch.qo_indptr,
            cum_seq_lens_kv=torch.nn.functional.pad(torch.cumsum(batch.seq_lens, 0, dtype=torch.int32), (1, 0)),
        )
