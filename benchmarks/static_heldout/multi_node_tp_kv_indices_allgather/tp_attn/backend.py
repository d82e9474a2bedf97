"""Each rank plans its own FlashInfer wrappers from the broadcast metadata."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from tpdist import StepMeta, StepPlan, TPConfig
from tp_attn.buffers import graph_workspace, make_overflow_decode, prefill_workspace


class RankAttnBackend:
    def __init__(self, cfg: TPConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "NHD"  # ok: FC103
        max_bs = cfg.largest_bucket
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.last_page_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_ws = graph_workspace(cfg, device)
        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_workspace(device), self._kv_layout)
        self.overflow_decode = make_overflow_decode(cfg, device, self._kv_layout)
        self.overflow_active = False
        self.cur_bs = 0
        self.last_max_len: Optional[torch.Tensor] = None

    def _head_args(self) -> Tuple[int, int, int, int]:
        return (self.cfg.heads_per_rank, self.cfg.kv_heads_per_rank, self.cfg.head_dim, self.cfg.page_size)

    def init_graph_wrappers(self) -> None:
        self.last_page_buf.fill_(1)  # ok: FC104
        for bs in self.cfg.buckets:
            self.decode_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws,
                self._kv_layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_buf[:bs],
            )

    def prepare_capture(self, bs: int) -> None:
        self.kv_indptr_pinned[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.last_page_pinned[:bs] = 1
        self.decode_wrappers[bs].plan(
            self.kv_indptr_pinned[: bs + 1], self.kv_indices_buf, self.last_page_pinned[:bs], *self._head_args()
        )
        self.cur_bs = bs
        self.overflow_active = False

    def prepare_decode(self, bs: int, meta: StepMeta) -> None:
        real_bs = meta.batch_size
        self.last_max_len = max(meta.seq_lens[:real_bs])  # expect: FC101
        self.last_page_buf[:real_bs].copy_(meta.last_page_len, non_blocking=True)  # ok: FC104
        self.kv_indptr_pinned[: real_bs + 1].copy_(meta.kv_indptr_host)
        self.kv_indptr_pinned[real_bs + 1 : bs + 1] = meta.num_pages
        self.last_page_pinned[:real_bs].copy_(meta.last_page_host)
        self.last_page_pinned[real_bs:bs] = 1
        self.decode_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_pinned[: bs + 1], meta.kv_indices, self.last_page_pinned[:bs], *self._head_args()
        )
        self.last_page_buf[real_bs:bs] = 1  # expect: FC104
        self.cur_bs = bs
        self.overflow_active = False

    def plan_prefill(self, meta: StepMeta, plan: Optional[StepPlan]) -> None:
        if plan is not None:
            # rank 0 still holds the scheduler's host tensors
            self.prefill_wrapper.plan(  # ok: FC102
                plan.qo_indptr_cpu, plan.kv_indptr_cpu, meta.kv_indices, plan.last_page_cpu,
                *self._head_args(), causal=True,
            )
        else:
            self.prefill_wrapper.plan(  # expect: FC102
                meta.qo_indptr_host, meta.kv_indptr, meta.kv_indices, meta.last_page_host,
                *self._head_args(), causal=True,
            )

    def plan_overflow(self, meta: StepMeta) -> None:
        heads, kv_heads, head_dim, page_size = self._head_args()
        self.overflow_decode.plan(  # expect: FC102
            **dict(
                indptr=meta.kv_indptr_host,
                indices=meta.kv_indices,
                last_page_len=meta.last_page_len,
                num_qo_heads=heads,
                num_kv_heads=kv_heads,
                head_dim=head_dim,
                page_size=page_size,
            )
        )
        self.overflow_active = True

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if self.overflow_active:
            return self.overflow_decode.run(q, kv_cache)  # expect: FC108
        return self.decode_wrappers[self.cur_bs].run(q, kv_cache)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)
