"""FlashInfer backend of Star Attention.

Phase 1 (context encoding) runs blockwise local attention: every block of this host attends to the anchor block
and to itself, planned on a ragged prefill.  Phase 2 (query and generation) attends to every page this host keeps;
the partial output and its LSE are gathered from all hosts and merged.  Decode steps replay a graph per bucket.
"""

import functools
from typing import Dict, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from staratt import PLAN_STATE_FIELDS, ContextLayout, StarConfig, cu_lens, merge_all, split_query_tokens
from sa_attn.metadata import QueryMetadataBuilder, QueryStepMeta, StepBatch
from sa_attn.workspace import anchor_workspace, graph_workspace, query_workspace, remote_decode_workspace


class StarAttentionBackend:
    def __init__(self, cfg: StarConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.builder = QueryMetadataBuilder(cfg, device)
        self.sm_scale = cfg.head_dim**-0.5

        self.anchor_ws = anchor_workspace(device)
        # phase 1: (anchor + block) keys for each local block's queries
        self.context_prefill = BatchPrefillWithRaggedKVCacheWrapper(self.anchor_ws, "NHD")
        # phase 2 with several query tokens per request
        self.query_prefill = BatchPrefillWithPagedKVCacheWrapper(self.anchor_ws, "HND")
        self._plan_query_prefill = functools.partial(self.query_prefill.plan, causal=False)
        # phase 2, one token per request, batches larger than the largest bucket
        decode_backend = "trtllm-gen" if cfg.use_trtllm_query else "fa2"
        self.query_decode = BatchDecodeWithPagedKVCacheWrapper(
            query_workspace(cfg, device), "HND", backend=decode_backend
        )
        # the anchor's pages are replicated on every host; only host 0 adds the anchor partial
        self.anchor_decode = BatchDecodeWithPagedKVCacheWrapper(self.anchor_ws, "HND")
        self.remote_ws = remote_decode_workspace(cfg, device)

        n = cfg.max_batch_size
        self.g_kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.g_kv_indices = torch.zeros(n * cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.g_last_page_len = torch.ones(n, dtype=torch.int32, device=device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.plan_snapshots: Dict[int, dict] = {}
        self.lse_scratch: Optional[torch.Tensor] = None
        self.merge_out: Optional[torch.Tensor] = None
        self.context_max_block = 0

    # ------------------------------------------------------------------ set-up
    def init_cuda_graph_state(self) -> None:
        self.g_kv_indptr.zero_()  # ok: FC104
        for bs in self.cfg.decode_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                graph_workspace(self.cfg, bs, self.device),
                "HND",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.g_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.g_kv_indices,
                paged_kv_last_page_len_buffer=self.g_last_page_len[:bs],
            )

    def _plan_kwargs(self) -> dict:
        c = self.cfg
        return dict(
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=c.page_size,
            q_data_type=c.dtype,
        )

    # ------------------------------------------------------------------ phase 1
    def plan_context_blocks(self, layout: ContextLayout, num_anchor: int) -> None:
        max_block = int(layout.block_lens_cpu.max())  # ok: FC101
        qo_indptr = cu_lens(layout.block_lens_cpu)
        kv_indptr = cu_lens(layout.block_lens_cpu + num_anchor)
        self.context_prefill.plan(  # ok: FC102
            qo_indptr, kv_indptr, self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim,
            causal=True, q_data_type=self.cfg.dtype,
        )
        self.context_max_block = max_block

    def forward_context(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.context_prefill.run(q, k, v)

    # ------------------------------------------------------------------ phase 2, eager
    def init_forward_metadata(self, batch: StepBatch) -> QueryStepMeta:
        meta = self.builder.build(batch)
        meta.query_positions = split_query_tokens(batch.positions, batch.context_len)
        kw = self._plan_kwargs()
        if batch.is_decode:
            self.query_decode.plan(meta.kv_indptr_host, batch.kv_indices, meta.last_page_len_host, **kw)  # ok: FC102
        else:
            qo_indptr = cu_lens(batch.query_lens)
            self._plan_query_prefill(  # expect: FC102
                qo_indptr, meta.kv_indptr_host, batch.kv_indices, meta.last_page_len_host,
                kw["num_qo_heads"], kw["num_kv_heads"], kw["head_dim"], kw["page_size"],
                q_data_type=self.cfg.dtype,
            )
        return meta

    def plan_anchor(self, bs: int, anchor_indptr_host: torch.Tensor, anchor_pages: torch.Tensor,
                    anchor_last_host: torch.Tensor) -> None:
        self.anchor_decode.plan(anchor_indptr_host, anchor_pages, anchor_last_host, **self._plan_kwargs())

    def forward_remote(self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                       seq_lens: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        """Queries forwarded by another host (no graph): trtllm-gen over this host's pages."""
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.remote_ws,
            block_tables=block_tables,
            seq_lens=seq_lens,
            max_seq_len=max_seq_len,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
        )

    # ------------------------------------------------------------------ phase 2, graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        indptr_host = torch.arange(bs + 1, dtype=torch.int32)
        last_host = torch.ones(bs, dtype=torch.int32)
        self.graph_wrappers[bs].plan(indptr_host, self.g_kv_indices[:bs], last_host, **self._plan_kwargs())
        self._ensure_scratch(bs)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepBatch) -> QueryStepMeta:
        meta = self.builder.build(batch, pad_to=bs)
        n = meta.num_pages
        self.g_kv_indices[:n].copy_(batch.kv_indices[:n], non_blocking=True)  # ok: FC104
        self._ensure_scratch(bs)
        self.graph_wrappers[bs].plan(  # expect: FC102
            meta.kv_indptr, self.g_kv_indices[:n], meta.last_page_len_host, **self._plan_kwargs()
        )
        self.g_last_page_len[meta.batch_size : bs].fill_(1)  # expect: FC104
        self.merge_out[:bs].zero_()  # ok: FC104
        return meta

    def _ensure_scratch(self, bs: int) -> None:
        rows = bs * self.cfg.num_hosts
        if self.lse_scratch is None or self.lse_scratch.shape[0] < rows:
            self.lse_scratch = torch.empty(  # expect: FC107
                rows, self.cfg.num_qo_heads, dtype=torch.float32, device=self.device
            )
        if self.merge_out is None:
            self.merge_out = torch.zeros(  # ok: FC107
                self.cfg.max_batch_size, self.cfg.num_qo_heads, self.cfg.head_dim,
                dtype=self.cfg.dtype, device=self.device,
            )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, anchor_cache: torch.Tensor, bs: int,
                       remote_out: torch.Tensor, remote_lse: torch.Tensor, remote_valid: torch.Tensor):
        w = self.graph_wrappers[bs] if bs in self.graph_wrappers else self.query_decode
        out, lse = w.run_return_lse(q, kv_cache)  # ok: FC108
        if self.cfg.host_rank == 0:
            a_out, a_lse = self.anchor_decode.run_return_lse(q, anchor_cache)  # expect: FC108
            out, lse = merge_all(
                torch.stack([out, a_out]), torch.stack([lse, a_lse]), torch.ones(2, q.shape[0], dtype=torch.bool,
                                                                                device=q.device)
            )
        outs = torch.cat([out.unsqueeze(0), remote_out], dim=0)
        lses = torch.cat([lse.unsqueeze(0), remote_lse], dim=0)
        merged, _ = merge_all(outs, lses, remote_valid)
        self.merge_out[: q.shape[0]].copy_(merged)
        return self.merge_out[: q.shape[0]]

    # ------------------------------------------------------------------ maintenance
    def rebase_anchor(self, anchor_pages: torch.Tensor, num_anchor_pages: int) -> None:
        """The scheduler moved the shared anchor block: the packed indices start with the anchor's pages."""
        self.g_kv_indices[:num_anchor_pages].copy_(anchor_pages)  # expect: FC104

    def snapshot_plan(self, bs: int) -> None:
        w = self.graph_wrappers[bs]
        snap = {}
        for name in PLAN_STATE_FIELDS:
            snap[name] = getattr(w, name, None)  # expect: FC103
        self.plan_snapshots[bs] = snap

    def workspace_bytes(self) -> Dict[str, int]:
        return {
            "anchor": self.anchor_ws.numel(),
            "remote": self.remote_ws.numel(),
            "query": self.query_decode._float_workspace_buffer.numel(),  # expect: FC103
        }
