"""FlashInfer attention for the connector worker, shaped like vLLM v1's backend."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
    trtllm_batch_decode_with_kv_cache,
)

from kvconn.config import EngineConfig


@dataclass
class CommonStepInputs:
    num_reqs: int
    num_decodes: int
    num_decode_tokens: int
    query_start_loc: torch.Tensor        # device
    query_start_loc_cpu: torch.Tensor    # pinned
    seq_lens: torch.Tensor               # device
    seq_lens_cpu: torch.Tensor           # pinned
    block_table_np: np.ndarray           # (num_reqs, max_pages) host page table
    block_table: torch.Tensor            # device copy, for trtllm-gen
    slot_mapping: torch.Tensor           # device


@dataclass
class FlashInferStepMetadata:
    num_reqs: int
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    paged_kv_indices: torch.Tensor
    paged_kv_last_page_len: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    max_seq_len: int
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    use_cascade: bool = False
    use_trtllm_decode: bool = False


def _alloc_trtllm_workspace(cfg: EngineConfig, device: torch.device) -> torch.Tensor:
    # trtllm-gen keeps its multi-CTA reduction counters in this buffer
    return torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105


def _common_prefix_pages(rows: np.ndarray, pages: np.ndarray) -> int:
    """Number of leading pages every row of the host page table shares."""
    if rows.shape[0] < 2:
        return 0
    limit = int(pages.min())
    same = (rows[:, :limit] == rows[0, :limit]).all(axis=0)
    return limit if same.all() else int(np.argmin(same))


class FlashInferAttentionBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self.scale = cfg.head_dim ** -0.5
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.decode_workspace = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.trtllm_workspace = _alloc_trtllm_workspace(cfg, device)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", use_tensor_cores=True)
        self.cascade_wrapper = MultiLevelCascadeAttentionWrapper(2, self.prefill_workspace, "NHD")
        max_bs = cfg.max_num_seqs
        # device buffers the captured decode graphs read (shared by every bucket)
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.num_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        # pinned host mirrors the planner reads
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def init_graph_buffers(self) -> None:
        self.kv_indptr_buf.zero_()
        self.kv_last_page_len_buf.fill_(1)  # ok: FC104

    def make_graph_wrapper(self, bs: int, workspace: torch.Tensor) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices_buf,
            paged_kv_last_page_len_buffer=self.kv_last_page_len_buf[:bs],
        )
        self.graph_wrappers[bs] = w
        return w

    def decode_plan_args(self) -> dict:
        cfg = self.cfg
        return dict(
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.bfloat16,
        )

    def plan_graph_decode(self, bs: int, meta: FlashInferStepMetadata) -> None:
        """Fill the bound buffers of bucket ``bs`` from the host mirrors, then plan it."""
        w = self.graph_wrappers[bs]
        nnz = int(self.kv_indptr_cpu[bs])
        indptr = self.kv_indptr_buf[: bs + 1]
        indptr.copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices_buf[:nnz].copy_(meta.paged_kv_indices[:nnz], non_blocking=True)
        w.plan(indptr, self.kv_indices_buf[:nnz], self.kv_last_page_len_cpu[:bs], **self.decode_plan_args())  # expect: FC102

    # ---------------------------------------------------------------- forward
    def write_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        page, off = slot_mapping // self.page_size, slot_mapping % self.page_size
        kv_cache[page, 0, off] = k
        kv_cache[page, 1, off] = v

    def _decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: FlashInferStepMetadata) -> torch.Tensor:
        if meta.use_cascade:
            return self.cascade_wrapper.run(q, kv_cache)  # expect: FC108
        if meta.use_trtllm_decode:
            nd = meta.num_decodes
            return trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv_cache,
                workspace_buffer=self.trtllm_workspace,
                block_tables=meta.block_tables[:nd],
                seq_lens=meta.seq_lens[:nd],
                max_seq_len=meta.max_seq_len,
                bmm1_scale=self.scale,
                bmm2_scale=1.0,
            )
        return meta.decode_wrapper.run(q, kv_cache)  # ok: FC108

    def forward_decode(self, q, k, v, kv_cache, meta: FlashInferStepMetadata) -> torch.Tensor:
        """Pure decode; this is what the captured graphs run."""
        self.write_kv(kv_cache, k, v, meta.slot_mapping)
        return self._decode(q, kv_cache, meta)

    def forward(self, q, k, v, kv_cache, meta: FlashInferStepMetadata) -> torch.Tensor:
        self.write_kv(kv_cache, k, v, meta.slot_mapping)
        nd = meta.num_decode_tokens
        out = torch.empty_like(q)
        if meta.num_decodes:
            out[:nd] = self._decode(q[:nd], kv_cache, meta)
        if meta.num_prefills:
            out[nd:] = self.prefill_wrapper.run(q[nd:], kv_cache)
        return out


class FlashInferMetadataBuilder:
    """Per-step metadata: the page table on the host, the eager wrappers planned."""

    def __init__(self, backend: FlashInferAttentionBackend, cfg: EngineConfig):
        self.backend = backend
        self.cfg = cfg
        self.device = backend.device
        self.page_size = cfg.page_size

    def build(self, common: CommonStepInputs) -> FlashInferStepMetadata:
        be = self.backend
        n, nd = common.num_reqs, common.num_decodes
        page = self.page_size
        seq_lens_np = common.seq_lens_cpu[:n].numpy()
        pages_np = (seq_lens_np + page - 1) // page
        indptr_np = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(pages_np, out=indptr_np[1:])
        last_np = ((seq_lens_np - 1) % page + 1).astype(np.int32)
        rows = [common.block_table_np[i, : pages_np[i]] for i in range(n)]
        indices_np = np.concatenate(rows).astype(np.int32) if rows else np.zeros(0, dtype=np.int32)
        be.kv_indptr_cpu[: n + 1].copy_(torch.from_numpy(indptr_np))
        be.kv_last_page_len_cpu[:n].copy_(torch.from_numpy(last_np))
        paged_kv_indices = torch.from_numpy(indices_np).to(self.device, non_blocking=True)
        max_seq_len = int(common.seq_lens_cpu[:n].max()) if n else 0  # ok: FC101
        prefix = _common_prefix_pages(common.block_table_np[:nd], pages_np[:nd])
        use_cascade = nd > 1 and prefix >= self.cfg.cascade_min_prefix_pages
        use_trtllm = not use_cascade and max_seq_len >= self.cfg.long_context_threshold
        meta = FlashInferStepMetadata(
            num_reqs=n,
            num_decodes=nd,
            num_prefills=n - nd,
            num_decode_tokens=common.num_decode_tokens,
            paged_kv_indices=paged_kv_indices,
            paged_kv_last_page_len=torch.from_numpy(last_np).to(self.device, non_blocking=True),
            seq_lens=common.seq_lens,
            block_tables=common.block_table,
            slot_mapping=common.slot_mapping,
            max_seq_len=max_seq_len,
            decode_wrapper=be.decode_wrapper,
            use_cascade=use_cascade,
            use_trtllm_decode=use_trtllm,
        )
        if nd and use_cascade:
            self._plan_cascade(nd, prefix, indptr_np, indices_np, last_np)
        elif nd and not use_trtllm:
            be.decode_wrapper.plan(  # ok: FC102
                be.kv_indptr_cpu[: nd + 1],
                paged_kv_indices[: indptr_np[nd]],
                be.kv_last_page_len_cpu[:nd],
                **be.decode_plan_args(),
            )
        if n > nd:
            qo_indptr = common.query_start_loc[nd:] - common.query_start_loc[nd]
            kv_indptr_cpu = be.kv_indptr_cpu[nd : n + 1] - be.kv_indptr_cpu[nd]
            be.prefill_wrapper.plan(  # expect: FC102
                qo_indptr,
                kv_indptr_cpu,
                paged_kv_indices[indptr_np[nd] :],
                be.kv_last_page_len_cpu[nd:n],
                self.cfg.num_qo_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                page,
                causal=True,
                q_data_type=torch.bfloat16,
                kv_data_type=torch.bfloat16,
            )
        return meta

    def _plan_cascade(self, nd: int, prefix_pages: int, indptr_np, indices_np, last_np) -> None:
        page = self.page_size
        shared_kv_indptr = np.array([0, prefix_pages], dtype=np.int32)
        unique_kv_indptr = indptr_np[: nd + 1] - np.arange(nd + 1, dtype=np.int32) * prefix_pages
        unique = [indices_np[indptr_np[i] + prefix_pages : indptr_np[i + 1]] for i in range(nd)]
        shared_indices = torch.from_numpy(indices_np[:prefix_pages].copy()).to(self.device, non_blocking=True)
        unique_indices = torch.from_numpy(np.concatenate(unique)).to(self.device, non_blocking=True)
        self.backend.cascade_wrapper.plan(  # ok: FC102
            [torch.tensor([0, nd], dtype=torch.int32), torch.arange(nd + 1, dtype=torch.int32)],
            [torch.from_numpy(shared_kv_indptr), torch.from_numpy(unique_kv_indptr)],
            [shared_indices, unique_indices],
            [torch.tensor([page], dtype=torch.int32), torch.from_numpy(last_np[:nd].copy())],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            page,
        )
