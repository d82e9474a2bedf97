"""FlashInfer attention for rollouts.

The samples of a prompt share its pages, so decode runs as a two-level cascade
(shared prompt, then each sample's own tokens) once the prompts are long enough;
short prompts decode flat, through graph-mode wrappers per batch bucket.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
    trtllm_batch_context_with_kv_cache,
)

from rlroll.config import PolicyShape, RolloutConfig

KV = Tuple[torch.Tensor, torch.Tensor]


@dataclass
class HostPageTables:
    """Flat per-sample tables plus the cascade split (shared prompt pages / each sample's own pages)."""

    kv_indptr: np.ndarray
    kv_indices: np.ndarray
    last_page_len: np.ndarray
    shared_indptr: np.ndarray
    shared_indices: np.ndarray
    shared_last_page_len: np.ndarray
    own_indptr: np.ndarray
    own_indices: np.ndarray
    own_last_page_len: np.ndarray


@dataclass
class RolloutBatch:
    is_prefill: bool
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_tables: torch.Tensor
    num_groups: int
    group_sizes: torch.Tensor
    group_sizes_cpu: torch.Tensor
    prefix_lens: torch.Tensor
    prefix_lens_cpu: torch.Tensor
    tables: Optional[HostPageTables] = None
    cu_q_lens: Optional[torch.Tensor] = None
    cu_kv_lens: Optional[torch.Tensor] = None
    graph_bs: Optional[int] = None
    max_q_len: int = 1
    max_kv_len: int = 0


class RolloutAttnBackend:
    GRAPH_WS_BYTES = 384 * 1024 * 1024

    def __init__(self, cfg: RolloutConfig, shape: PolicyShape, device: torch.device):
        self.cfg = cfg
        self.shape = shape
        self.device = device
        max_bs = max(cfg.graph_buckets)
        max_pages = max_bs * cfg.max_pages_per_seq

        self.graph_workspace = torch.zeros(self.GRAPH_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.cascade_workspace = torch.empty(cfg.cascade_workspace_bytes(shape), dtype=torch.uint8, device=device)  # ok: FC105
        ctx_ws = torch.empty(cfg.trtllm_workspace_bytes(shape), dtype=torch.uint8, device=device)  # ok: FC105
        ctx_ws.zero_()
        self.ctx_workspace = ctx_ws

        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(cfg.max_running + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.zeros(cfg.max_running, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_dev = torch.zeros(cfg.max_running + 1, dtype=torch.int32, device=device)
        self.group_indptr_gpu = torch.zeros(cfg.max_prompts + 1, dtype=torch.int32, device=device)
        self.seq_prefix_lens = torch.zeros(max_bs, dtype=torch.int32, device=device)

        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in cfg.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.cascade_workspace, "NHD", use_tensor_cores=True)
        self.cascade = MultiLevelCascadeAttentionWrapper(2, self.cascade_workspace, "NHD")
        self._eager_plan = functools.partial(
            self.eager_decode.plan,
            num_qo_heads=shape.num_qo_heads,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            page_size=cfg.page_size,
            q_data_type=shape.dtype,
        )
        self.use_cascade = False
        self.active_bs: Optional[int] = None

    def init_graph_state(self) -> None:
        self.kv_indptr_buf.zero_()
        self.last_page_len_buf.fill_(1)  # ok: FC104

    def _plan_cascade(self, fb: RolloutBatch) -> None:
        s, g, bs = self.shape, fb.num_groups, fb.batch_size
        t = fb.tables
        self.group_indptr_gpu[0] = 0
        torch.cumsum(fb.group_sizes, 0, out=self.group_indptr_gpu[1 : g + 1])
        self.cascade.plan(  # expect: FC102
            [self.group_indptr_gpu[: g + 1], torch.arange(bs + 1, dtype=torch.int32)],
            [torch.from_numpy(t.shared_indptr), torch.from_numpy(t.own_indptr)],
            [torch.from_numpy(t.shared_indices).to(self.device), torch.from_numpy(t.own_indices).to(self.device)],
            [torch.from_numpy(t.shared_last_page_len), torch.from_numpy(t.own_last_page_len)],
            s.num_qo_heads,
            s.num_kv_heads,
            s.head_dim,
            self.cfg.page_size,
            q_data_type=s.dtype,
        )

    def init_forward_metadata(self, fb: RolloutBatch) -> None:
        if fb.is_prefill:
            return
        bs = fb.batch_size
        self.active_bs = fb.graph_bs
        self.use_cascade = self.cfg.n_samples > 1 and bool(fb.num_groups)
        if self.use_cascade and (fb.prefix_lens >= self.cfg.cascade_min_prefix).all():  # expect: FC101
            self._plan_cascade(fb)
            return
        self.use_cascade = False
        t = fb.tables
        kv_indices = torch.from_numpy(t.kv_indices).to(self.device, non_blocking=True)
        if fb.graph_bs is None:
            # eager path: page counts are cumsummed on the device, next to the indices kernel
            pages = (fb.seq_lens + self.cfg.page_size - 1) // self.cfg.page_size
            torch.cumsum(pages, 0, out=self.kv_indptr_dev[1 : bs + 1])
            self._eager_plan(  # expect: FC102
                self.kv_indptr_dev[: bs + 1], kv_indices, torch.from_numpy(t.last_page_len)
            )
            return
        gbs = fb.graph_bs
        self.kv_indptr_cpu[: bs + 1] = torch.from_numpy(t.kv_indptr)
        n_pages = int(self.kv_indptr_cpu[bs])  # ok: FC101
        self.kv_indptr_cpu[bs + 1 : gbs + 1] = n_pages
        self.last_page_len_cpu[:bs] = torch.from_numpy(t.last_page_len)
        self.last_page_len_cpu[bs:gbs] = 1
        self.kv_indices_buf[:n_pages].copy_(kv_indices)  # ok: FC104
        prefix_per_sample = torch.repeat_interleave(fb.prefix_lens, fb.group_sizes, output_size=bs)  # ok: FC101
        self.seq_prefix_lens[:bs].copy_(prefix_per_sample)
        self.graph_wrappers[gbs].plan(  # ok: FC102
            self.kv_indptr_cpu[: gbs + 1],
            self.kv_indices_buf[:n_pages],
            self.last_page_len_cpu[:gbs],
            self.shape.num_qo_heads,
            self.shape.num_kv_heads,
            self.shape.head_dim,
            self.cfg.page_size,
            q_data_type=self.shape.dtype,
        )
        # leave the unused tail of the host mirror clean for the next, smaller batch
        self.last_page_len_cpu[gbs:].zero_()  # ok: FC104

    def forward_decode(self, q: torch.Tensor, kv: KV) -> torch.Tensor:
        if self.use_cascade:
            return self.cascade.run(q, kv)  # expect: FC108
        w = self.graph_wrappers.get(self.active_bs) if self.active_bs is not None else self.eager_decode
        return w.run(q, kv)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv: KV, fb: RolloutBatch) -> torch.Tensor:
        return trtllm_batch_context_with_kv_cache(
            query=q,
            kv_cache=kv,
            workspace_buffer=self.ctx_workspace,
            block_tables=fb.block_tables,
            seq_lens=fb.seq_lens,
            max_q_len=fb.max_q_len,
            max_kv_len=fb.max_kv_len,
            bmm1_scale=self.shape.head_dim ** -0.5,
            bmm2_scale=1.0,
            batch_size=fb.batch_size,
            cum_seq_lens_q=fb.cu_q_lens,
            cum_seq_lens_kv=fb.cu_kv_lens,
        )
