"""Attention state of one tier: its own workspaces, eager wrappers, graph-bound buffers and graph wrappers."""

from __future__ import annotations

from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from cascade.config import _GRAPH_WS_MIB, ModelSpec
from cascade.kvpool import TierKVPool
from tiers.batch import PrefillBatch, TierBatch

# Both tiers' graph wrappers share one int workspace (the planner's index arrays are small).
_SHARED_WS_FIELDS = ("_int_workspace_buffer",)


class TierAttention:
    def __init__(self, spec: ModelSpec, pool: TierKVPool, device: torch.device, decode_backend: str,
                 shared_int_workspace: torch.Tensor):
        self.spec = spec
        self.pool = pool
        self.device = device
        self._backend = decode_backend  # ok: FC103
        self.window_layers = frozenset(spec.window_layers)
        self.shared_int_workspace = shared_int_workspace
        self.decode_workspace = torch.empty(spec.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.window_workspace = torch.zeros(spec.window_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_workspace = torch.empty(spec.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.context_workspace = torch.empty(spec.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.context_workspace.zero_()
        self.graph_workspace = torch.zeros(_GRAPH_WS_MIB[spec.name] << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", backend=decode_backend)
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.window_workspace, "NHD")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        mb = spec.max_graph_bs
        self.graph_kv_indptr = torch.zeros(mb + 1, dtype=torch.int32, device=device)
        self.graph_kv_indices = torch.zeros(mb * spec.max_pages_per_req, dtype=torch.int32, device=device)
        self.graph_last_page_len = torch.ones(mb, dtype=torch.int32, device=device)
        self.kv_indptr_pinned = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_pinned = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.current_decode = self.decode_wrapper

    # ------------------------------------------------------------------ eager decode
    def plan_eager_decode(self, batch: TierBatch) -> None:
        s = self.spec
        plan_kw = {
            "indptr": batch.kv_indptr_cpu,
            "indices": batch.kv_indices,
            "last_page_len": batch.last_page_len,
            "num_qo_heads": s.num_qo_heads,
            "num_kv_heads": s.num_kv_heads,
            "head_dim": s.head_dim,
            "page_size": s.page_size,
            "data_type": torch.bfloat16,
        }
        self.decode_wrapper.plan(**plan_kw)  # expect: FC102
        if self.window_layers:
            self.window_wrapper.plan(  # ok: FC102
                batch.kv_indptr_cpu,
                batch.kv_indices,
                batch.last_page_len_cpu,
                s.num_qo_heads,
                s.num_kv_heads,
                s.head_dim,
                s.page_size,
                window_left=s.window,
                data_type=torch.bfloat16,
            )
        self.current_decode = self.decode_wrapper

    # ------------------------------------------------------------------ graphs
    def init_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.graph_kv_indices,
            paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
        )
        for field in _SHARED_WS_FIELDS:
            setattr(w, field, self.shared_int_workspace)  # expect: FC103
        self.kv_indptr_pinned[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self._plan_bucket(w, bs, self.graph_kv_indices[:bs])
        self.graph_wrappers[bs] = w
        self.current_decode = w
        return w

    def _plan_bucket(self, w: BatchDecodeWithPagedKVCacheWrapper, bs: int, indices: torch.Tensor) -> None:
        s = self.spec
        w.plan(  # ok: FC102
            self.kv_indptr_pinned[: bs + 1],
            indices,
            self.last_page_len_pinned[:bs],
            s.num_qo_heads,
            s.num_kv_heads,
            s.head_dim,
            s.page_size,
            data_type=torch.bfloat16,
        )

    def prepare_replay(self, bs: int, batch: TierBatch) -> None:
        n = batch.batch_size
        self.kv_indptr_pinned[: n + 1].copy_(batch.kv_indptr_cpu)
        self.kv_indptr_pinned[n + 1 : bs + 1] = batch.kv_indptr_cpu[n]
        self.last_page_len_pinned[:n].copy_(batch.last_page_len_cpu)
        self.graph_last_page_len[:bs].copy_(self.last_page_len_pinned[:bs], non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[bs]
        self._plan_bucket(w, bs, batch.kv_indices)
        # padding rows: empty ranges at the end of the real pages
        self.graph_kv_indptr[n + 1 : bs + 1] = self.graph_kv_indptr[n]  # expect: FC104
        self.current_decode = w

    # ------------------------------------------------------------------ attention
    def forward_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                       batch: TierBatch) -> torch.Tensor:
        self.pool.write(layer_id, batch.out_loc, k, v)
        kv = self.pool.layer(layer_id)
        if layer_id in self.window_layers:
            return self.window_wrapper.run(q, kv)  # expect: FC108
        return self.current_decode.run(q, kv)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                        pb: PrefillBatch) -> torch.Tensor:
        self.pool.write(layer_id, pb.out_loc, k, v)
        kv = self.pool.layer(layer_id)
        if pb.use_trtllm_context:
            return trtllm_batch_context_with_kv_cache(
                query=q,
                kv_cache=kv,
                workspace_buffer=self.context_workspace,
                block_tables=pb.block_tables,
                seq_lens=pb.seq_lens,
                max_q_len=pb.max_q_len,
                max_kv_len=pb.max_q_len,
                bmm1_scale=self.spec.head_dim ** -0.5,
                bmm2_scale=1.0,
                batch_size=pb.batch_size,
                cum_seq_lens_q=pb.qo_indptr,
                cum_seq_lens_kv=pb.qo_indptr,
            )
        return self.prefill_wrapper.run(q, kv)
