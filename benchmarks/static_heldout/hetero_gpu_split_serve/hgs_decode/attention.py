"""Decode-GPU attention: CUDAGraph decode wrappers per bucket, trtllm-gen past the buckets, the MTP head's wrapper."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    trtllm_batch_decode_with_kv_cache,
)

from hgs.config import ClusterConfig, ModelDims
from hgs.devices import DeviceContext
from hgs.model import KV


@dataclass
class DecodeMeta:
    num_reqs: int
    num_pages: int
    indptr_np: np.ndarray
    last_page_len_np: np.ndarray
    indices: torch.Tensor
    rows: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    max_seq_len: int


class DecodeAttention:
    def __init__(self, cfg: ClusterConfig, dims: ModelDims, ctx: DeviceContext):
        self.cfg = cfg
        self.dims = dims
        self.ctx = ctx
        dev = ctx.device
        self._use_cuda_graph = cfg.enable_graphs  # ok: FC103
        max_bs = max(cfg.decode_buckets)
        self.graph_workspace = torch.zeros(cfg.graph_workspace_bytes(dims), dtype=torch.uint8, device=dev)  # ok: FC106
        self.indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.indices_buf = torch.zeros(max_bs * cfg.max_pages_per_seq, dtype=torch.int32, device=dev)
        self.last_page_len_buf = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.indptr_host = torch.zeros(cfg.max_decode_seqs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.zeros(cfg.max_decode_seqs, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in cfg.decode_buckets:
            self.graph_wrappers[bs] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self.indptr_buf[: bs + 1],
                self.indices_buf,
                self.last_page_len_buf[:bs],
                "NHD",
                use_tensor_cores=True,
            )
        self.mtp_wrapper = BatchDecodeWithPagedKVCacheWrapper(ctx.workspace, "NHD", use_tensor_cores=True)
        self.init_graph_buffers()

    def init_graph_buffers(self) -> None:
        self.indptr_buf.zero_()
        self.last_page_len_buf.fill_(1)  # ok: FC104

    def prepare_replay(self, bs: int, meta: DecodeMeta) -> None:
        d, n, nnz = self.dims, meta.num_reqs, meta.num_pages
        self.indptr_host[: n + 1] = torch.from_numpy(meta.indptr_np)
        self.indptr_host[n + 1 : bs + 1] = nnz
        self.last_page_len_host[:n] = torch.from_numpy(meta.last_page_len_np)
        self.last_page_len_host[n:bs] = 1
        self.mtp_wrapper.plan(
            self.indptr_host[: n + 1], meta.indices, self.last_page_len_host[:n],
            d.num_qo_heads, d.num_kv_heads, d.head_dim, self.cfg.page_size, data_type=d.dtype,
        )
        self.indices_buf[:nnz].copy_(meta.indices, non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.indptr_host[: bs + 1],
            self.indices_buf[:nnz],
            self.last_page_len_host[:bs],
            d.num_qo_heads,
            d.num_kv_heads,
            d.head_dim,
            self.cfg.page_size,
            data_type=d.dtype,
        )
        # padded rows read page 0: clear whatever an earlier, larger batch left behind the live indices
        self.indices_buf[nnz : nnz + bs].zero_()  # expect: FC104

    def forward_decode(self, q: torch.Tensor, kv: KV, bs: Optional[int], meta: DecodeMeta) -> torch.Tensor:
        if bs is None or not self._use_cuda_graph:
            return trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv,
                workspace_buffer=self.ctx.workspace,
                block_tables=meta.block_tables,
                seq_lens=meta.seq_lens,
                max_seq_len=meta.max_seq_len,
                bmm1_scale=self.dims.head_dim ** -0.5,
                bmm2_scale=1.0,
            )
        return self.graph_wrappers[bs].run(q, kv)  # ok: FC108
