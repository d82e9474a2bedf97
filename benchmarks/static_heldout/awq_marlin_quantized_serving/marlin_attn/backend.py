"""FlashInfer attention for the AWQ engine: decode graphs per bucket, a paged prefill, eager decodes."""
from __future__ import annotations

import functools
from typing import Callable, Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from awq.config import AWQServeConfig
from marlin_attn.metadata import DecodeMeta, PrefillMeta
from marlin_attn.workspaces import (
    decode_graph_workspace,
    eager_decode_workspace,
    long_decode_workspace,
    prefill_workspace,
)

KV_LAYOUT = "HND"
_WS_ATTR = "_float_workspace_buffer"

PlanFn = Callable[..., None]


class AWQAttnBackend:
    def __init__(self, cfg: AWQServeConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        max_bs = cfg.largest_bucket
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_workspace = decode_graph_workspace(device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._bucket_plans: Dict[int, PlanFn] = {}
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_workspace(cfg, device), KV_LAYOUT)
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(eager_decode_workspace(cfg, device), KV_LAYOUT)
        self.long_decode = BatchDecodeWithPagedKVCacheWrapper(
            long_decode_workspace(cfg.long_decode_workspace_bytes(), device.index or 0),
            KV_LAYOUT,
            backend="trtllm-gen",
        )
        self.rope_positions: Optional[torch.Tensor] = None
        self.prefill_scratch: Optional[torch.Tensor] = None
        self._plan_info: Dict[int, int] = {}  # ok: FC103
        self.active_bs = 0
        self.long_rows_active = False

    @property
    def _head_kwargs(self) -> dict:
        return dict(
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim=self.cfg.head_dim,
            page_size=self.cfg.page_size,
            q_data_type=torch.float16,
            kv_data_type=self.cfg.kv_dtype,
        )

    def init_graph_wrappers(self) -> None:
        self.kv_last_page_buf.fill_(1)  # ok: FC104
        for bs in self.cfg.buckets:
            w = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                KV_LAYOUT,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.kv_last_page_buf[:bs],
            )
            self.graph_wrappers[bs] = w
            self._bucket_plans[bs] = functools.partial(w.plan, **self._head_kwargs)

    # ---- prefill -------------------------------------------------------------------------------
    def init_forward_metadata(self, meta: PrefillMeta) -> None:
        n = meta.num_tokens
        if self.rope_positions is None or self.rope_positions.numel() < n:
            self.rope_positions = torch.empty(n, dtype=torch.int64, device=self.device)  # expect: FC107
        if self.prefill_scratch is None:
            self.prefill_scratch = torch.empty(  # ok: FC107
                self.cfg.max_num_tokens, self.cfg.hidden_size, dtype=torch.float16, device=self.device
            )
        self.prefill_wrapper.plan(  # expect: FC102
            meta.qo_indptr,
            meta.kv_indptr_cpu,
            meta.kv_indices,
            meta.last_page_len_cpu,
            causal=True,
            **self._head_kwargs,
        )
        self._plan_info[-1] = meta.max_pages

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)

    # ---- decode --------------------------------------------------------------------------------
    def plan_eager_decode(self, meta: DecodeMeta) -> None:
        w = self.long_decode if meta.long_rows else self.eager_decode
        w.plan(meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_len_cpu, **self._head_kwargs)  # ok: FC102
        self.long_rows_active = meta.long_rows
        self.active_bs = 0

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_last_page_host[:bs] = 1
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.kv_indices_buf,
            self.kv_last_page_host[:bs],
            **self._head_kwargs,
        )
        self.active_bs = bs
        self.long_rows_active = False

    def _plan_bucket(self, bs: int) -> None:
        plan = self._bucket_plans[bs]
        plan(self.kv_indptr_host[: bs + 1], self.kv_indices_buf, self.kv_last_page_buf[:bs])  # expect: FC102
        self._plan_info[bs] = int(self.kv_indptr_host[bs])

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: DecodeMeta) -> None:
        real_bs = meta.batch_size
        n = meta.num_pages
        self.kv_indices_buf[:n].copy_(meta.kv_indices[:n], non_blocking=True)  # ok: FC104
        self.kv_indptr_host[: real_bs + 1].copy_(meta.kv_indptr_cpu)
        self.kv_indptr_host[real_bs + 1 : bs + 1] = n
        self.kv_last_page_host[:real_bs].copy_(meta.last_page_len_cpu)
        self._plan_bucket(bs)
        self.kv_last_page_buf[real_bs:bs].fill_(1)  # expect: FC104
        self.active_bs = bs
        self.long_rows_active = False

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if self.cfg.use_long_decode and self.long_rows_active:
            return self.long_decode.run(q, kv_cache)  # expect: FC108
        w = self.graph_wrappers[self.active_bs] if self.active_bs else self.eager_decode
        return w.run(q, kv_cache)  # ok: FC108

    def workspace_bytes_in_use(self) -> int:
        return sum(getattr(w, _WS_ATTR).numel() for w in (self.prefill_wrapper, self.eager_decode))  # expect: FC103
