"""FlashInfer plumbing for dual chunk attention.

Decode runs the intra and successive-chunk streams through graph-mode decode wrappers (one pair per captured batch
size, bound to per-stream buffers). The inter-chunk stream only changes when a request crosses a chunk boundary, so
it is planned on a tensor-core eager wrapper at boundaries. Prefill runs the new chunk through a ragged wrapper and
its cached succ / inter pages through paged prefill wrappers; on Blackwell a prompt's first chunk (nothing cached
yet) can go through trtllm-gen's context kernel instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from dcaserve.config import INTRA_RAGGED_WORKSPACE_BYTES, DCAConfig
from dcaserve.pages import DCAPageTable, StreamPages

logger = logging.getLogger(__name__)

GRAPH_STREAMS = ("intra", "succ")


@dataclass
class DCAForwardMetadata:
    decode: Optional[Dict[str, BatchDecodeWithPagedKVCacheWrapper]] = None
    batch_size: int = 0
    first_chunk_only: bool = False
    prefill_streams: Dict[str, BatchPrefillWithPagedKVCacheWrapper] = field(default_factory=dict)


class DualChunkBackend:
    def __init__(self, cfg: DCAConfig, page_table: DCAPageTable, device: torch.device):
        self.cfg = cfg
        self.page_table = page_table
        self.device = device
        self._kv_layout = "NHD"  # ok: FC103
        self.decode_workspace = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.ragged_workspace = torch.zeros(INTRA_RAGGED_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.trtllm_workspace = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105

        max_bs = cfg.max_graph_bs
        max_nnz = max_bs * cfg.max_pages_per_req
        # graph-bound buffers, one set per graph stream
        self.kv_indptr = {s: torch.zeros(max_bs + 1, dtype=torch.int32, device=device) for s in GRAPH_STREAMS}
        self.kv_indices = {s: torch.zeros(max_nnz, dtype=torch.int32, device=device) for s in GRAPH_STREAMS}
        self.kv_last_page_len = {s: torch.ones(max_bs, dtype=torch.int32, device=device) for s in GRAPH_STREAMS}
        # pinned host mirrors handed to plan()
        self.kv_indptr_host = {s: torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True) for s in GRAPH_STREAMS}
        self.last_page_host = {s: torch.ones(max_bs, dtype=torch.int32, pin_memory=True) for s in GRAPH_STREAMS}

        self.graph_wrappers: Dict[int, Dict[str, BatchDecodeWithPagedKVCacheWrapper]] = {}
        self.eager_decode = {
            s: BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout, use_tensor_cores=True)
            for s in GRAPH_STREAMS
        }
        # inter-chunk keys move only at chunk boundaries: planned there, run every step
        self.inter_decode = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, self._kv_layout, use_tensor_cores=True
        )
        self.prefill_wrappers = {
            s: BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout, backend="fa2")
            for s in ("succ", "inter")
        }
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, self._kv_layout)
        self.inter_positions: Optional[torch.Tensor] = None
        self.row_chunk: Optional[torch.Tensor] = None
        self._inter_signature: Optional[tuple] = None
        self.forward_metadata = DCAForwardMetadata()

    # ------------------------------------------------------------------ set-up
    def init_cuda_graph_state(self) -> None:
        for s in GRAPH_STREAMS:
            self.kv_indptr[s].zero_()
            self.kv_last_page_len[s].fill_(1)  # ok: FC104
        self.inter_positions = torch.full(
            (self.cfg.max_graph_bs,), self.cfg.chunk_size - 1, dtype=torch.int64, device=self.device
        )

    def warmup_kernels(self) -> None:
        """JIT-compile the inter-chunk decode module before the first request arrives."""
        if not hasattr(self.inter_decode, "_cached_module"):  # expect: FC103
            logger.info("inter-chunk decode module not built yet; it will compile on first plan")

    def _common_plan_kwargs(self) -> dict:
        c = self.cfg
        return dict(
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=c.page_size,
            q_data_type=torch.bfloat16,
        )

    def _ensure_row_chunk(self) -> torch.Tensor:
        if self.row_chunk is None:
            self.row_chunk = torch.zeros(self.cfg.max_batch_size, dtype=torch.int64, device=self.device)  # ok: FC107
        return self.row_chunk

    def _fill_row_chunk(self, bs: int, seq_lens_np: np.ndarray) -> None:
        """Chunk index of every row; the merge drops the succ stream of rows in chunk 0."""
        row_chunk = (np.maximum(seq_lens_np - 1, 0) // self.cfg.chunk_size).astype(np.int64)
        self._ensure_row_chunk()[:bs].copy_(torch.from_numpy(row_chunk), non_blocking=True)

    # ------------------------------------------------------------------ capture
    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        wrappers: Dict[str, BatchDecodeWithPagedKVCacheWrapper] = {}
        for s in GRAPH_STREAMS:
            wrappers[s] = BatchDecodeWithPagedKVCacheWrapper(
                self.decode_workspace,
                self._kv_layout,
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr[s][: bs + 1],
                paged_kv_indices_buffer=self.kv_indices[s],
                paged_kv_last_page_len_buffer=self.kv_last_page_len[s][:bs],
            )
        self.graph_wrappers[bs] = wrappers
        self._ensure_row_chunk()[:bs].zero_()
        dummy_indptr = torch.arange(bs + 1, dtype=torch.int32)
        dummy_last = torch.ones(bs, dtype=torch.int32)
        for s in GRAPH_STREAMS:
            wrappers[s].plan(dummy_indptr, self.kv_indices[s][:bs], dummy_last, **self._common_plan_kwargs())
        self.forward_metadata = DCAForwardMetadata(decode=wrappers, batch_size=bs)

    # ------------------------------------------------------------------ replay
    def refresh_chunk_tables(self, bs: int, rids: Sequence[int], seq_lens_np: np.ndarray) -> None:
        """Fill the graph streams for bucket ``bs`` and plan them; runs before every decode replay."""
        assert bs in self.graph_wrappers, f"no graph captured for batch size {bs}"  # expect: FC109
        split = self.page_table.split_for_decode(rids, seq_lens_np)
        self.plan_inter_boundary(rids, seq_lens_np)
        for s in GRAPH_STREAMS:
            part: StreamPages = split[s]
            self.kv_indptr_host[s].numpy()[: bs + 1] = part.indptr
            self.last_page_host[s].numpy()[:bs] = part.last_page_len
            self.kv_indices[s][: part.nnz].copy_(torch.from_numpy(part.indices), non_blocking=True)  # ok: FC104
        self._fill_row_chunk(bs, seq_lens_np)

        wrappers = self.graph_wrappers[bs]
        for s in GRAPH_STREAMS:
            wrappers[s].plan(  # ok: FC102
                self.kv_indptr_host[s][: bs + 1],
                self.kv_indices[s],
                self.last_page_host[s][:bs],
                **self._common_plan_kwargs(),
            )

        # rows still in their first chunk have no successive-chunk keys: make the stream empty for them
        first_chunk = np.flatnonzero(seq_lens_np <= self.cfg.chunk_size)
        if first_chunk.size:
            rows = torch.from_numpy(first_chunk).to(self.device, non_blocking=True)
            self.kv_last_page_len["succ"].index_fill_(0, rows, 0)  # expect: FC104
            self.last_page_host["succ"][torch.from_numpy(first_chunk)] = 0  # ok: FC104
        self.inter_positions = torch.full((bs,), self.cfg.chunk_size - 1, dtype=torch.int64, device=self.device)  # expect: FC107
        self.forward_metadata = DCAForwardMetadata(decode=wrappers, batch_size=bs)

    def plan_inter_boundary(self, rids: Sequence[int], seq_lens_np: np.ndarray) -> None:
        """Re-plan the inter-chunk stream when some row crossed a chunk boundary since the last plan."""
        chunks = tuple((np.maximum(seq_lens_np - 1, 0) // self.cfg.chunk_size).tolist())
        signature = (tuple(rids), chunks)
        if signature == self._inter_signature:
            return
        part = self.page_table.split_for_decode(rids, seq_lens_np)["inter"]
        self.inter_decode.plan(
            torch.from_numpy(part.indptr),
            torch.from_numpy(part.indices).to(self.device, non_blocking=True),
            torch.from_numpy(part.last_page_len),
            **self._common_plan_kwargs(),
        )
        self._inter_signature = signature

    # ------------------------------------------------------------------ eager
    def init_forward_metadata(self, fb) -> None:
        if fb.is_decode:
            self._plan_eager_decode(fb)
        else:
            self._plan_chunked_prefill(fb)

    def _plan_eager_decode(self, fb) -> None:
        split = self.page_table.split_for_decode(fb.rids, fb.seq_lens_np)
        for s in GRAPH_STREAMS:
            part = split[s]
            indptr = torch.from_numpy(part.indptr).to(self.device, non_blocking=True)
            self.eager_decode[s].plan(  # expect: FC102
                indptr,
                torch.from_numpy(part.indices).to(self.device, non_blocking=True),
                torch.from_numpy(part.last_page_len),
                **self._common_plan_kwargs(),
            )
        self.plan_inter_boundary(fb.rids, fb.seq_lens_np)
        self._fill_row_chunk(fb.batch_size, fb.seq_lens_np)
        self.forward_metadata = DCAForwardMetadata(decode=self.eager_decode, batch_size=fb.batch_size)

    def _plan_chunked_prefill(self, fb) -> None:
        c = self.cfg
        qo_indptr_host = torch.from_numpy(fb.qo_indptr_np)
        first_chunk_only = c.trtllm_first_chunk and not fb.prefix_lens_np.any()
        if first_chunk_only:
            self.forward_metadata = DCAForwardMetadata(batch_size=fb.batch_size, first_chunk_only=True)
            return
        self.ragged_wrapper.plan(  # ok: FC102
            qo_indptr_host, qo_indptr_host, c.num_qo_heads, c.num_kv_heads, c.head_dim, causal=True
        )
        split = self.page_table.split_for_prefill(fb.rids, fb.prefix_lens_np)
        for s in ("succ", "inter"):
            part = split[s]
            self.prefill_wrappers[s].plan(  # expect: FC102
                fb.qo_indptr,
                torch.from_numpy(part.indptr),
                torch.from_numpy(part.indices).to(self.device, non_blocking=True),
                torch.from_numpy(part.last_page_len),
                c.num_qo_heads,
                c.num_kv_heads,
                c.head_dim,
                c.page_size,
                causal=False,
            )
        self.forward_metadata = DCAForwardMetadata(
            batch_size=fb.batch_size, prefill_streams=dict(self.prefill_wrappers)
        )
