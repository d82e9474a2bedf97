"""FlashInfer MLA backend for DSA: sparse top-k decode, dense early layers, ragged prefill."""

from __future__ import annotations

import functools
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla
from flashinfer.mla import BatchMLAPagedAttentionWrapper

from dsa.batch import DecodeBatch, ExtendBatch
from dsa.config import MLA_GRAPH_WORKSPACE_BYTES, DSAConfig
from dsa.kv_cache import MLATokenPool
from dsa.sparse_pages import SparseLayout

_WS_FIELD = "_float_workspace_buffer"


class DSAAttnBackend:
    def __init__(self, cfg: DSAConfig, pool: MLATokenPool, device: torch.device, use_trtllm_dense: bool):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self.use_trtllm_dense = use_trtllm_dense
        self.q_dtype = getattr(torch, cfg.dtype)
        self.sm_scale = cfg.qk_head_dim**-0.5
        max_bs = cfg.max_batch_size

        # CSR of the selected token slots; every captured bucket binds a slice of these
        self.qo_indptr_buf = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(max_bs * cfg.index_topk, dtype=torch.int32, device=device)
        self.kv_len_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        # pinned mirrors handed to plan()
        self.qo_indptr_host = torch.arange(max_bs + 1, dtype=torch.int32).pin_memory()
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.sparse_workspace = torch.empty(cfg.sparse_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.dense_workspace = torch.zeros(cfg.dense_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.sparse_mla = BatchMLAPagedAttentionWrapper(self.sparse_workspace, backend="fa2")
        self.dense_mla = BatchMLAPagedAttentionWrapper(self.dense_workspace)
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.dense_workspace, "NHD")
        self._plan_ragged = functools.partial(self.ragged.plan, causal=True)
        # Blackwell: the dense layers go through trtllm-gen MLA decode instead of dense_mla
        self.trtllm_workspace = torch.empty(cfg.trtllm_workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105

        self.graph_workspace: Optional[torch.Tensor] = None
        self.graph_mla: Dict[int, BatchMLAPagedAttentionWrapper] = {}

    # ------------------------------------------------------------------ set-up
    def init_cuda_graph_state(self, batch_sizes: List[int]) -> None:
        self.graph_workspace = torch.zeros(MLA_GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.kv_len_buf.fill_(1)  # ok: FC104
        for bs in batch_sizes:
            self.graph_mla[bs] = BatchMLAPagedAttentionWrapper(
                self.graph_workspace,
                use_cuda_graph=True,
                qo_indptr=self.qo_indptr_buf[: bs + 1],
                kv_indptr=self.kv_indptr_buf[: bs + 1],
                kv_indices=self.kv_indices_buf,
                kv_len_arr=self.kv_len_buf[:bs],
            )

    def workspace_report(self) -> Dict[str, int]:
        eager = getattr(self.sparse_mla, _WS_FIELD)  # expect: FC103
        report = {"sparse_eager": eager.numel(), "dense": self.dense_workspace.numel()}
        if self.graph_workspace is not None:
            report["graph"] = self.graph_workspace.numel()
        return report

    # ------------------------------------------------------------ eager decode
    def init_forward_metadata(self, fb: DecodeBatch, layout: SparseLayout) -> None:
        bs, total = layout.bs, layout.total
        qo_indptr = torch.arange(bs + 1, dtype=torch.int32)
        self.sparse_mla.plan(  # expect: FC102
            qo_indptr,
            torch.from_numpy(layout.kv_indptr_np),
            self.kv_indices_buf[:total],
            fb.sparse_lens,
            self.cfg.num_heads,
            self.cfg.kv_lora_rank,
            self.cfg.qk_rope_head_dim,
            1,
            False,
            self.sm_scale,
            self.q_dtype,
            self.q_dtype,
        )
        self._plan_dense(fb, bs)

    def _plan_dense(self, fb: DecodeBatch, bs: int) -> None:
        if self.use_trtllm_dense:
            return
        seq_lens_np = fb.seq_lens_cpu.numpy()
        page_indptr, page_indices = self.pool.page_csr([r.pool_idx for r in fb.reqs], seq_lens_np)
        self.dense_mla.plan(  # ok: FC102
            torch.arange(bs + 1, dtype=torch.int32),
            torch.from_numpy(page_indptr),
            torch.from_numpy(page_indices).to(self.device, non_blocking=True),
            fb.seq_lens_cpu,
            self.cfg.num_heads,
            self.cfg.kv_lora_rank,
            self.cfg.qk_rope_head_dim,
            self.cfg.page_size,
            False,
            self.sm_scale,
            self.q_dtype,
            self.q_dtype,
        )

    # ------------------------------------------------------------- graph decode
    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: DecodeBatch, layout: SparseLayout) -> None:
        assert self.graph_mla, "init_cuda_graph_state() must run before capture"  # ok: FC109
        fb.graph_bs = bs
        self.kv_indptr_host[: bs + 1].copy_(torch.from_numpy(layout.kv_indptr_np))
        self.kv_len_host[:bs].copy_(torch.from_numpy(layout.counts_np))
        self.graph_mla[bs].plan(
            self.qo_indptr_host[: bs + 1],
            self.kv_indptr_host[: bs + 1],
            self.kv_indices_buf[: layout.total],
            self.kv_len_host[:bs],
            self.cfg.num_heads,
            self.cfg.kv_lora_rank,
            self.cfg.qk_rope_head_dim,
            1,
            False,
            self.sm_scale,
            self.q_dtype,
            self.q_dtype,
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: DecodeBatch, layout: SparseLayout) -> None:
        real, total = layout.bs, layout.total
        pad = bs - real
        self.kv_indptr_host[: real + 1].copy_(torch.from_numpy(layout.kv_indptr_np))
        self.kv_len_host[:real].copy_(torch.from_numpy(layout.counts_np))
        if pad:
            # padded rows of the bucket read one dummy slot each, right after the real ones
            steps = np.arange(total + 1, total + pad + 1, dtype=np.int32)
            self.kv_indptr_host[real + 1 : bs + 1].copy_(torch.from_numpy(steps))
            self.kv_len_host[real:bs] = 1
        fb.graph_bs = bs
        self.qo_indptr_buf[: bs + 1].copy_(self.qo_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.graph_mla[bs].plan(  # ok: FC102
            self.qo_indptr_host[: bs + 1],
            self.kv_indptr_host[: bs + 1],
            self.kv_indices_buf[: total + pad],
            self.kv_len_host[:bs],
            self.cfg.num_heads,
            self.cfg.kv_lora_rank,
            self.cfg.qk_rope_head_dim,
            1,
            False,
            self.sm_scale,
            self.q_dtype,
            self.q_dtype,
        )
        self.kv_indices_buf[total : total + pad].zero_()  # expect: FC104
        # next step may use a smaller bucket: its unused rows must read as one-token dummies
        self.kv_len_host[real:].fill_(1)  # ok: FC104

    # ------------------------------------------------------------------ prefill
    def init_forward_metadata_extend(self, eb: ExtendBatch) -> None:
        self._plan_ragged(  # expect: FC102
            eb.qo_indptr,
            eb.qo_indptr,
            self.cfg.num_heads,
            self.cfg.num_heads,
            self.cfg.qk_head_dim,
            head_dim_vo=self.cfg.v_head_dim,
            q_data_type=self.q_dtype,
        )

    # ------------------------------------------------------------------ forward
    def forward_sparse(self, q_nope: torch.Tensor, q_pe: torch.Tensor, fb: DecodeBatch) -> torch.Tensor:
        w = self.graph_mla[fb.graph_bs] if fb.graph_bs is not None else self.sparse_mla
        ckv, kpe = self.pool.ckv_kpe_tokens()
        return w.run(q_nope, q_pe, ckv, kpe)  # ok: FC108

    def forward_dense(self, q_nope: torch.Tensor, q_pe: torch.Tensor, fb: DecodeBatch) -> torch.Tensor:
        if self.use_trtllm_dense:
            query = torch.cat([q_nope, q_pe], dim=-1).unsqueeze(1)
            out = trtllm_batch_decode_with_kv_cache_mla(
                query=query,
                kv_cache=self.pool.kv.unsqueeze(1),
                workspace_buffer=self.trtllm_workspace,
                qk_nope_head_dim=self.cfg.qk_nope_head_dim,
                kv_lora_rank=self.cfg.kv_lora_rank,
                qk_rope_head_dim=self.cfg.qk_rope_head_dim,
                block_tables=self.pool.page_table[fb.req_pool_indices],
                seq_lens=fb.seq_lens,
                max_seq_len=self.cfg.max_context_len,
                bmm1_scale=self.sm_scale,
            )
            return out.squeeze(1)
        ckv = self.pool.kv[..., : self.cfg.kv_lora_rank]
        kpe = self.pool.kv[..., self.cfg.kv_lora_rank :]
        return self.dense_mla.run(q_nope, q_pe, ckv, kpe)  # expect: FC108

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.ragged.run(q, k, v)
