"""Sparse paged decode on FlashInfer: selection graphs, bucketed decode graphs, eager fallback."""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from nsa import (
    SPARSE_DECODE_WORKSPACE_BYTES,
    LightningIndexer,
    SparseConfig,
    count_selected,
    flat_gather_index,
    host_selected_counts,
    select_topk_blocks,
    write_sparse_indptr,
)
from nsa_attn.compat import PLAN_STATE_ATTR
from nsa_attn.metadata import DecodeBatch, PrefillBatch, SparseDecodeMeta, SparseMetadataBuilder
from nsa_attn.workspace import dense_long_workspace, dense_long_workspace_bytes, prefill_workspace

class SelectionGraph:
    """The indexer and top-k of one bucket, captured; its outputs are its own static buffers."""

    def __init__(self, bs: int, cfg: SparseConfig, device: torch.device):
        k = cfg.top_k_pages
        self.graph = torch.cuda.CUDAGraph()
        self.hidden = torch.zeros(bs, cfg.hidden_size, dtype=torch.bfloat16, device=device)
        self.block_table = torch.zeros(bs, cfg.max_pages_per_req, dtype=torch.int64, device=device)
        self.num_pages = torch.zeros(bs, dtype=torch.int32, device=device)
        self.scores = torch.zeros(bs, cfg.max_pages_per_req, dtype=torch.float32, device=device)
        self.pages = torch.zeros(bs * k, dtype=torch.int32, device=device)
        self.counts = torch.zeros(bs, dtype=torch.int32, device=device)


class SparseDecodeBackend:
    def __init__(self, cfg: SparseConfig, indexer: LightningIndexer, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.indexer = indexer
        self.builder = SparseMetadataBuilder(cfg, indexer, device)
        k = cfg.top_k_pages
        max_bs = cfg.max_batch

        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * k, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        graph_ws_bytes = max_bs * cfg.num_qo_heads * k * cfg.page_size * 8 + cfg.max_selected * 4096
        self.graph_workspace = torch.zeros(graph_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.eager_workspace = torch.zeros(SPARSE_DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_ws = prefill_workspace(cfg.max_prefill_tokens * cfg.num_qo_heads * cfg.head_dim * 4, device)

        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in cfg.buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices[: bs * k],
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
        self.eager_sparse = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD")
        self.dense_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD")
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD", backend="fa2")

        self.plan_kwargs = dict(
            num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            page_size=cfg.page_size, q_data_type=torch.bfloat16,
        )
        self.selection_graphs: Dict[int, SelectionGraph] = {}
        self.page_keys: Optional[torch.Tensor] = None
        self.forward_meta: Optional[SparseDecodeMeta] = None

    def attach_page_keys(self, page_keys: torch.Tensor) -> None:
        self.page_keys = page_keys

    # ---------------------------------------------------------------- graphs
    def init_cuda_graph_state(self) -> None:
        self.kv_last_page_len.fill_(self.cfg.page_size)  # ok: FC104

    def capture_selection(self, bs: int, stream: torch.cuda.Stream) -> None:
        sg = SelectionGraph(bs, self.cfg, self.device)
        with torch.cuda.graph(sg.graph, stream=stream):
            scores = self.indexer(sg.hidden, self.page_keys, sg.block_table, sg.num_pages, sg.scores)
            topk = select_topk_blocks(scores, self.cfg.top_k_pages)
            sg.counts.copy_(count_selected(topk))
            picked = torch.gather(sg.block_table, 1, topk.clamp(min=0)).to(torch.int32)
            sg.pages.view(bs, -1)[:, : topk.shape[1]].copy_(picked)  # ok: FC104
        self.selection_graphs[bs] = sg

    def _plan_bucket(self, bs: int) -> None:
        cfg = self.cfg
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices[: bs * cfg.top_k_pages], self.last_page_len_host[:bs], **self.plan_kwargs
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        k = self.cfg.top_k_pages
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32) * k
        self._plan_bucket(bs)
        self.forward_meta = SparseDecodeMeta(
            batch_size=bs, bucket=bs, kv_indptr=self.kv_indptr[: bs + 1], kv_indptr_host=self.kv_indptr_host[: bs + 1],
            kv_indices=self.kv_indices[: bs * k], last_page_len_host=self.last_page_len_host[:bs],
            sel_counts=self.selection_graphs[bs].counts,
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: DecodeBatch) -> SparseDecodeMeta:
        real_bs = batch.batch_size
        k = self.cfg.top_k_pages
        sg = self.selection_graphs[bs]
        sg.hidden[:real_bs].copy_(batch.hidden)
        sg.block_table[:real_bs, : batch.block_table.shape[1]].copy_(batch.block_table)
        sg.num_pages[:real_bs].copy_(batch.num_pages)
        sg.graph.replay()

        counts_np = host_selected_counts(batch.num_pages_np, k)
        n = int(counts_np.sum())
        flat = torch.from_numpy(flat_gather_index(counts_np, k)).pin_memory()
        self.kv_indptr_host[0] = 0
        self.kv_indptr_host[1 : real_bs + 1] = torch.from_numpy(np.cumsum(counts_np, dtype=np.int32))
        self.last_page_len_host[:real_bs].copy_(batch.last_page_len_cpu)
        self.last_page_len_host[real_bs:bs].fill_(1)
        torch.index_select(sg.pages, 0, flat.to(self.device, non_blocking=True), out=self.kv_indices[:n])  # ok: FC104

        meta = SparseDecodeMeta(
            batch_size=real_bs, bucket=bs, kv_indptr=self.kv_indptr[: bs + 1], kv_indptr_host=self.kv_indptr_host[: bs + 1],
            kv_indices=self.kv_indices[:n], last_page_len_host=self.last_page_len_host[:bs], sel_counts=sg.counts,
            max_seq_len=int(batch.seq_lens_cpu.max()),
        )
        self._plan_bucket(bs)
        meta.kv_indptr[real_bs + 1 :] = n  # expect: FC104
        self.forward_meta = meta
        return meta

    # ----------------------------------------------------------------- eager
    def init_forward_metadata(self, batch: DecodeBatch) -> SparseDecodeMeta:
        cfg = self.cfg
        meta = self.builder.build(batch)
        if meta.num_selected > cfg.max_selected:
            raise ValueError(f"{batch.batch_size} requests select more than {cfg.max_selected} pages")
        dense_indptr = torch.from_numpy(
            np.concatenate([[0], np.cumsum(batch.num_pages_np)]).astype(np.int32)
        )
        self.dense_decode.plan(dense_indptr, batch.flat_pages, batch.last_page_len_cpu, **self.plan_kwargs)  # ok: FC102
        self.eager_sparse.plan(meta.kv_indptr, meta.kv_indices, meta.last_page_len_host, **self.plan_kwargs)  # expect: FC102
        self.forward_meta = meta
        return meta

    def plan_prefill(self, batch: PrefillBatch) -> None:
        cfg = self.cfg
        qo_indptr = torch.zeros(batch.batch_size + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(batch.extend_lens, 0, out=qo_indptr[1:])
        args = (qo_indptr, batch.kv_indptr_cpu, batch.kv_indices, batch.last_page_len_cpu)
        self.prefill.plan(  # expect: FC102
            *args, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, causal=True, q_data_type=torch.bfloat16
        )

    # --------------------------------------------------------------- forward
    def refresh_sparse_indptr(self) -> None:
        """Row offsets of the sparse layers, re-derived from the in-graph selection counts."""
        meta = self.forward_meta
        if meta is None or meta.bucket is None:
            return
        sg = self.selection_graphs[meta.bucket]
        write_sparse_indptr(self.kv_indptr[: meta.bucket + 1], sg.counts)  # expect: FC104

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        meta = self.forward_meta
        if layer_id < self.cfg.num_dense_layers:
            return self.dense_decode.run(q, kv_cache)  # expect: FC108
        w = self.graph_wrappers[meta.bucket] if meta.bucket is not None else self.eager_sparse
        return w.run(q, kv_cache)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, kv_cache)

    def forward_dense_eager(
        self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int
    ) -> torch.Tensor:
        cfg = self.cfg
        nbytes = dense_long_workspace_bytes(cfg.max_batch, cfg.num_qo_heads, cfg.max_context)
        ws = dense_long_workspace(nbytes, self.device.index or 0)
        return trtllm_batch_decode_with_kv_cache(
            query=q, kv_cache=kv_cache, workspace_buffer=ws, block_tables=block_tables, seq_lens=seq_lens,
            max_seq_len=max_seq_len, bmm1_scale=cfg.head_dim ** -0.5, bmm2_scale=1.0,
        )

    # ----------------------------------------------------------- diagnostics
    def check_graph_buffers(self) -> None:
        k = self.cfg.top_k_pages
        for bs, w in self.graph_wrappers.items():
            if w._paged_kv_indices_buf.numel() < bs * k:  # expect: FC103
                raise RuntimeError(f"bucket {bs}: indices buffer smaller than {bs * k} pages")

    def describe(self) -> str:
        info = getattr(self.dense_decode, PLAN_STATE_ATTR, None)  # expect: FC103
        return f"sparse backend: buckets={sorted(self.graph_wrappers)} dense_plan={info}"
