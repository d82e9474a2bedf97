"""FlashInfer attention backend: eager decode / prefill, graph-mode decode per bucket."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from ..config import WORKSPACE_BYTES, EngineConfig
from ..forward_batch import ForwardBatch, ForwardMode
from ..kv_pool import PagedKVPool
from ..recorder import StepHooks
from .kernels import fill_kv_indices_kernel


@dataclasses.dataclass
class DecodeMetadata:
    decode_wrapper: BatchDecodeWithPagedKVCacheWrapper


@dataclasses.dataclass
class ExtendMetadata:
    prefill_wrapper: BatchPrefillWithPagedKVCacheWrapper


class FlashInferBackend:
    def __init__(self, cfg: EngineConfig, pool: PagedKVPool, hooks: StepHooks, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.hooks = hooks
        self.device = device
        self.dtype = getattr(torch, cfg.dtype)
        self.shadow_eager = cfg.shadow_eager
        max_bs = cfg.max_running_requests
        self.decode_workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_workspace = torch.zeros(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.eager_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.eager_kv_indices = torch.zeros(cfg.num_pages, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.shadow_err = torch.zeros(1, dtype=torch.float32, device=device)
        self.forward_metadata = None
        self.cuda_graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    # ------------------------------------------------------------- host CSR
    def _host_csr(self, fb: ForwardBatch, pad_to: Optional[int] = None):
        ps = self.cfg.page_size
        lens = fb.seq_lens_cpu.numpy()
        bs = lens.shape[0]
        indptr = self.kv_indptr_host.numpy()
        last = self.kv_last_page_len_host.numpy()
        indptr[0] = 0
        np.cumsum((lens + ps - 1) // ps, out=indptr[1 : bs + 1])
        nnz = int(indptr[bs])
        last[:bs] = (lens - 1) % ps + 1
        if pad_to is not None and pad_to > bs:
            # padded rows: one page each, the dummy page 0
            indptr[bs + 1 : pad_to + 1] = nnz + np.arange(1, pad_to - bs + 1)
            last[bs:pad_to] = 1
        return bs, nnz

    def _fill_indices(self, fb: ForwardBatch, kv_indptr: torch.Tensor, kv_indices: torch.Tensor) -> None:
        stride = self.pool.req_to_page.shape[1]
        fill_kv_indices_kernel[(fb.batch_size,)](self.pool.req_to_page, fb.req_pool_indices, fb.seq_lens, kv_indptr, kv_indices, stride, self.cfg.page_size, 128)

    def _dims(self):
        c = self.cfg
        return c.num_heads, c.num_kv_heads, c.head_dim, c.page_size

    # ----------------------------------------------------------- eager path
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        self.hooks.before_step(fb)
        h, kvh, d, ps = self._dims()
        bs, nnz = self._host_csr(fb)
        self.eager_kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)
        self._fill_indices(fb, self.eager_kv_indptr, self.eager_kv_indices)
        if fb.forward_mode == ForwardMode.DECODE:
            self.decode_wrapper.plan(  # ok: FC102
                self.kv_indptr_host[: bs + 1],
                self.eager_kv_indices[:nnz],
                self.kv_last_page_len_host[:bs],
                h,
                kvh,
                d,
                ps,
                q_data_type=self.dtype,
            )
            self.forward_metadata = DecodeMetadata(self.decode_wrapper)
        else:
            self.prefill_wrapper.plan(  # expect: FC102
                fb.qo_indptr,
                self.kv_indptr_host[: bs + 1],
                self.eager_kv_indices[:nnz],
                self.kv_last_page_len_host[:bs],
                h,
                kvh,
                d,
                ps,
                causal=True,
                q_data_type=self.dtype,
            )
            self.forward_metadata = ExtendMetadata(self.prefill_wrapper)

    # ----------------------------------------------------------- graph path
    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indices = torch.zeros(
            max_bs * self.cfg.max_pages_per_request, dtype=torch.int32, device=self.device
        )
        self.cuda_graph_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len.fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        h, kvh, d, ps = self._dims()
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.cuda_graph_last_page_len[:bs],
        )
        self.cuda_graph_wrappers[bs] = w
        _, nnz = self._host_csr(fb)
        w.plan(
            self.kv_indptr_host[: bs + 1],
            self.cuda_graph_kv_indices[:nnz],
            self.kv_last_page_len_host[:bs],
            h,
            kvh,
            d,
            ps,
            q_data_type=self.dtype,
        )
        self.forward_metadata = DecodeMetadata(w)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self.hooks.before_step(fb)
        h, kvh, d, ps = self._dims()
        raw_bs, nnz = self._host_csr(fb, pad_to=bs)
        self.cuda_graph_kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)
        self.cuda_graph_kv_indices[nnz : nnz + bs - raw_bs].zero_()
        fill_kv_indices_kernel[(raw_bs,)](self.pool.req_to_page, fb.req_pool_indices, fb.seq_lens, self.cuda_graph_kv_indptr, self.cuda_graph_kv_indices, self.pool.req_to_page.shape[1], ps, 128)  # ok: FC104
        self.cuda_graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.cuda_graph_kv_indices[: nnz + bs - raw_bs],
            self.kv_last_page_len_host[:bs],
            h,
            kvh,
            d,
            ps,
            q_data_type=self.dtype,
        )
        # the mirror is shared with the eager path: leave unused rows as one-token rows
        self.kv_last_page_len_host[raw_bs:].fill_(1)  # ok: FC104
        self.forward_metadata = DecodeMetadata(self.cuda_graph_wrappers[bs])

    # --------------------------------------------------------------- forward
    def forward_decode(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        kv = self.pool.kv[layer_id]
        o = self.forward_metadata.decode_wrapper.run(q, kv)  # ok: FC108
        if self.shadow_eager:
            # debug: compare the graph path against a fresh eager run of the same plan inputs
            ref = self.decode_wrapper.run(q, kv)  # expect: FC108
            torch.maximum(self.shadow_err, (o - ref).abs().amax().float().reshape(1), out=self.shadow_err)
        return o

    def forward_extend(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.forward_metadata.prefill_wrapper.run(q, self.pool.kv[layer_id])
