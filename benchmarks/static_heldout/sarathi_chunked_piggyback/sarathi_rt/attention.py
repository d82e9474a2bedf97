"""FlashInfer attention for hybrid steps: graph-mode decode buckets, eager decode,
chunked prefill for the piggybacked prompts, trtllm-gen decode for large batches."""
from __future__ import annotations

import logging
from typing import Dict, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    trtllm_batch_decode_with_kv_cache,
)

from sarathi.build.batch_builder import HybridBatch
from sarathi.config import DECODE_WORKSPACE_BYTES, GRAPH_BUCKETS, ModelShape, SchedulerConfig

logger = logging.getLogger(__name__)


class ChunkedAttentionBackend:
    def __init__(self, cfg: SchedulerConfig, shape: ModelShape, device: torch.device):
        self.cfg = cfg
        self.shape = shape
        self.device = device
        self.max_graph_bs = max(GRAPH_BUCKETS)
        max_pages = self.max_graph_bs * cfg.max_pages_per_seq

        self.decode_workspace = torch.zeros(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.eager_workspace = torch.zeros(cfg.eager_decode_workspace_bytes(shape), dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes(shape), dtype=torch.uint8, device=device)  # ok: FC105
        self.trtllm_workspace = torch.empty(cfg.trtllm_workspace_bytes(shape), dtype=torch.uint8, device=device)  # expect: FC105

        # persistent buffers the decode graphs read by address
        self.kv_indptr_buf = torch.zeros(self.max_graph_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(self.max_graph_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(self.max_graph_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(self.max_graph_bs, dtype=torch.int32, pin_memory=True)

        self.graph_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in GRAPH_BUCKETS:
            self.graph_decode_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.decode_workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD", use_tensor_cores=True)
        self.chunk_prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.active_bs: Optional[int] = None
        self.use_trtllm = False
        self._plan_info = None

    def init_cuda_graph_state(self) -> None:
        # padded rows point at page 0 with one valid slot until the first plan
        self.kv_indptr_buf.zero_()
        self.last_page_len_buf.fill_(1)  # ok: FC104

    def warmup(self) -> None:
        """Plan and run the chunk kernel once so the JIT module is loaded before serving."""
        qo_indptr = torch.tensor([0, 16], dtype=torch.int32)
        kv_indptr = torch.tensor([0, 1], dtype=torch.int32)
        kv_indices = torch.zeros(1, dtype=torch.int32, device=self.device)
        last_page_len = torch.tensor([16], dtype=torch.int32)
        self.chunk_prefill_wrapper.plan(  # ok: FC102
            qo_indptr,
            kv_indptr,
            kv_indices,
            last_page_len,
            self.shape.num_qo_heads,
            self.shape.num_kv_heads,
            self.shape.head_dim,
            self.cfg.page_size,
            causal=True,
            q_data_type=self.shape.dtype,
        )
        if getattr(self.chunk_prefill_wrapper, "_cached_module", None) is None:  # expect: FC103
            logger.warning("chunk prefill module not JIT-compiled yet; first step will be slow")

    def _plan_prefill_chunks(self, batch: HybridBatch) -> None:
        s = self.shape
        self.chunk_prefill_wrapper.plan(  # expect: FC102
            batch.chunk_qo_indptr_gpu,
            batch.chunk_kv_indptr_cpu,
            batch.chunk_kv_indices_gpu,
            batch.chunk_last_page_len_cpu,
            s.num_qo_heads,
            s.num_kv_heads,
            s.head_dim,
            self.cfg.page_size,
            causal=True,
            sm_scale=s.sm_scale,
            q_data_type=s.dtype,
        )

    def init_forward_metadata(self, batch: HybridBatch, graph_bs: Optional[int] = None) -> None:
        s = self.shape
        nd = batch.num_decodes
        self.active_bs = graph_bs
        self.use_trtllm = graph_bs is None and nd > self.cfg.trtllm_decode_above
        self._plan_info = (nd, batch.num_prefill_tokens, graph_bs)  # ok: FC103
        if batch.num_prefill_tokens > 0:
            self._plan_prefill_chunks(batch)
        if nd == 0 or self.use_trtllm:
            return
        if graph_bs is None:
            plan_decode = self.eager_decode.plan
            plan_decode(  # expect: FC102
                batch.decode_kv_indptr_cpu,
                batch.decode_kv_indices_gpu,
                batch.decode_last_page_len_gpu,
                s.num_qo_heads,
                s.num_kv_heads,
                s.head_dim,
                self.cfg.page_size,
                q_data_type=s.dtype,
            )
            return
        n_pages = int(batch.decode_kv_indptr_cpu[nd])  # ok: FC101
        self.kv_indptr_cpu[: nd + 1].copy_(batch.decode_kv_indptr_cpu)
        self.kv_indptr_cpu[nd + 1 : graph_bs + 1] = n_pages
        self.last_page_len_cpu[:nd].copy_(batch.decode_last_page_len_cpu)
        self.kv_indptr_buf[: graph_bs + 1].copy_(self.kv_indptr_cpu[: graph_bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices_buf[:n_pages].copy_(batch.decode_kv_indices_gpu)  # ok: FC104
        wrapper = self.graph_decode_wrappers[graph_bs]
        wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: graph_bs + 1],
            self.kv_indices_buf[:n_pages],
            self.last_page_len_cpu[:graph_bs],
            s.num_qo_heads,
            s.num_kv_heads,
            s.head_dim,
            self.cfg.page_size,
            q_data_type=s.dtype,
        )
        # padded rows of the bucket attend one slot of page 0
        self.last_page_len_buf[nd:graph_bs].fill_(1)  # expect: FC104

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, batch: HybridBatch) -> torch.Tensor:
        if self.use_trtllm:
            return trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv_cache,
                workspace_buffer=self.trtllm_workspace,
                block_tables=batch.decode_block_tables_gpu,
                seq_lens=batch.decode_seq_lens_gpu,
                max_seq_len=batch.max_decode_len,
                bmm1_scale=self.shape.sm_scale,
                bmm2_scale=1.0,
            )
        w = self.graph_decode_wrappers[self.active_bs] if self.active_bs in self.graph_decode_wrappers else self.eager_decode
        return w.run(q, kv_cache)  # ok: FC108

    def forward_hybrid(self, q: torch.Tensor, kv_cache: torch.Tensor, batch: HybridBatch) -> torch.Tensor:
        nd = batch.num_decodes
        out = torch.empty_like(q)
        if nd:
            out[:nd] = self.forward_decode(q[:nd], kv_cache, batch)
        if batch.num_prefill_tokens:
            out[nd:] = self.chunk_prefill_wrapper.run(q[nd:], kv_cache)  # expect: FC108
        return out
