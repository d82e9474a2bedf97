"""BF16 pages: FlashInfer decode (graph-mode per bucket, or eager), paged prefill, trtllm-gen for big batches."""

from __future__ import annotations

import functools
from typing import Dict

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    trtllm_batch_decode_with_kv_cache,
)

from qswitch.dtypes import KVClass
from qswitch.metadata import DecodeMetadata
from qswitch_backends.base import KVBackend


def _int_workspace_of(src, *_unused) -> torch.Tensor:
    """Graph wrappers reuse the eager wrapper's int workspace (plan info, indices scratch)."""
    return src._int_workspace_buffer  # expect: FC103


class Bf16Backend(KVBackend):
    kv_class = KVClass.BF16

    def __init__(self, cfg, pool, ws, device):
        super().__init__(cfg, pool, ws, device)
        max_bs = cfg.max_graph_bs
        self.layout = self.pool._kv_layout  # ok: FC103
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(ws.get(KVClass.BF16), self.layout, use_tensor_cores=True)
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(ws.prefill_workspace, self.layout)
        self._plan_prefill = self.prefill.plan
        self._shared_int_ws = functools.partial(_int_workspace_of, self.eager_decode)
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.init_graph_buffers()

    def init_graph_buffers(self) -> None:
        self.kv_indptr.zero_()
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def init_forward_metadata(self, meta: DecodeMetadata) -> None:
        self.graph_bs = None
        self.eager_decode.plan(  # expect: FC102
            meta.kv_indptr, meta.kv_indices, meta.last_page_len_cpu, q_data_type=torch.bfloat16, **self.plan_kwargs()
        )

    def plan_extend(self, qo_indptr_cpu: torch.Tensor, kv_indptr_cpu: torch.Tensor, kv_indices: torch.Tensor, last_cpu: torch.Tensor) -> torch.Tensor:
        """Chunked prefill of BF16 requests; the device qo_indptr also feeds the output scatter kernel."""
        qo_indptr = qo_indptr_cpu.to(self.device, non_blocking=True)
        c = self.cfg
        self._plan_prefill(  # expect: FC102
            qo_indptr, kv_indptr_cpu, kv_indices, last_cpu, c.num_q_heads, c.num_kv_heads, c.head_dim, c.page_size,
            causal=True,
        )
        return qo_indptr

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.ws.graph_ws,
            self.layout,
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        w.reset_workspace_buffer(self.ws.graph_ws, self._shared_int_ws())
        self.graph_decode[bs] = w
        self.graph_bs = bs
        self.kv_indptr_pinned[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))
        self.last_page_len_pinned[:bs].fill_(1)
        w.plan(self.kv_indptr_pinned[: bs + 1], self.kv_indices[:bs], self.last_page_len_pinned[:bs], **self.plan_kwargs())

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: DecodeMetadata) -> None:
        rows = meta.batch_size
        n = int(meta.kv_indptr_cpu[rows])
        self.kv_indptr_pinned[: rows + 1].copy_(meta.kv_indptr_cpu)
        self.kv_indptr_pinned[rows + 1 : bs + 1].fill_(n)
        self.last_page_len_pinned[:rows].copy_(meta.last_page_len_cpu)
        self.last_page_len_pinned[rows:bs].fill_(1)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_pinned[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:n].copy_(meta.kv_indices)
        self.kv_last_page_len[:bs].copy_(self.last_page_len_pinned[:bs], non_blocking=True)
        self.graph_bs = bs
        self.graph_decode[bs].plan(  # ok: FC102
            self.kv_indptr_pinned[: bs + 1], self.kv_indices[:n], self.last_page_len_pinned[:bs], **self.plan_kwargs()
        )

    def forward_decode(self, q: torch.Tensor, layer_id: int, bs: int) -> torch.Tensor:
        kv = self.pool.layer(KVClass.BF16, layer_id)
        w = self.graph_decode.get(self.graph_bs, self.eager_decode)
        return w.run(q, kv)  # ok: FC108

    def forward_decode_large(self, q: torch.Tensor, layer_id: int, meta: DecodeMetadata) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            q, self.pool.layer(KVClass.BF16, layer_id), self.ws.trtllm_ws, meta.block_tables, meta.seq_lens_gpu,
            meta.max_seq_len, bmm1_scale=self.sm_scale, bmm2_scale=1.0,
        )

    def forward_extend(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.prefill.run(q, self.pool.layer(KVClass.BF16, layer_id))
