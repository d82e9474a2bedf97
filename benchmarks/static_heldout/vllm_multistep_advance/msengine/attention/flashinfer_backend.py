"""FlashInfer attention in the vLLM v0 layout: a per-runner ``FlashInferState`` owning workspaces,
wrappers and graph buffers, a per-step ``FlashInferMetadata`` that plans in ``begin_forward`` and
advances itself between the steps of a multi-step run, and a builder."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from msengine.attention.advance_kernels import advance_step_flashinfer

if TYPE_CHECKING:
    from msengine.worker.model_runner import GPUModelRunner

logger = logging.getLogger(__name__)

FLASHINFER_WORKSPACE_BUFFER_SIZE = 256 * 1024 * 1024
PAD_SLOT_ID = -1


class FlashInferState:
    def __init__(self, runner: "GPUModelRunner"):
        self.runner = runner
        self._float_workspace_buffer: Optional[torch.Tensor] = None
        self._prefill_workspace: Optional[torch.Tensor] = None
        self._trtllm_ws: Optional[torch.Tensor] = None
        self._prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
        self._decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        self._window_decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        self._is_graph_capturing = False
        self.graph_decode_wrappers: dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}

    # ------------------------------------------------------------- workspaces and wrappers
    def _use_tensor_cores(self) -> bool:
        return self.runner.num_heads // self.runner.num_kv_heads >= 4

    def get_workspace_buffer(self) -> torch.Tensor:
        if self._float_workspace_buffer is None:
            self._float_workspace_buffer = torch.empty(FLASHINFER_WORKSPACE_BUFFER_SIZE, dtype=torch.uint8, device=self.runner.device)  # expect: FC106
        return self._float_workspace_buffer

    def get_prefill_workspace(self) -> torch.Tensor:
        if self._prefill_workspace is None:
            r = self.runner
            nbytes = r.scheduler_config.max_num_batched_tokens * r.num_heads * r.head_dim * 4 + (32 << 20)
            self._prefill_workspace = torch.zeros(nbytes, dtype=torch.uint8, device=r.device)  # ok: FC106
        return self._prefill_workspace

    def get_trtllm_workspace(self) -> torch.Tensor:
        if self._trtllm_ws is None:
            r = self.runner
            nbytes = r.max_num_seqs * r.num_heads * r.head_dim * 8 + (16 << 20)
            self._trtllm_ws = torch.empty(nbytes, dtype=torch.uint8, device=r.device)  # expect: FC105
        return self._trtllm_ws

    def get_prefill_wrapper(self) -> BatchPrefillWithPagedKVCacheWrapper:
        if self._prefill_wrapper is None:
            self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.get_prefill_workspace(), "NHD")
        return self._prefill_wrapper

    def get_decode_wrapper(self) -> BatchDecodeWithPagedKVCacheWrapper:
        if self._decode_wrapper is None:
            self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self.get_workspace_buffer(), "NHD", use_tensor_cores=self._use_tensor_cores()
            )
        return self._decode_wrapper

    def get_window_decode_wrapper(self) -> BatchDecodeWithPagedKVCacheWrapper:
        # sliding-window layers (every other layer of the model) plan with window_left
        if self._window_decode_wrapper is None:
            self._window_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.get_workspace_buffer(), "NHD")
        return self._window_decode_wrapper

    def _graph_ws_bytes(self, batch_size: int) -> int:
        r = self.runner
        return batch_size * r.num_heads * r.head_dim * 4 * 32 + (8 << 20)

    # ------------------------------------------------------------- CUDA graphs
    @contextmanager
    def graph_capture(self, max_batch_size: int):
        dev = self.runner.device
        self._is_graph_capturing = True
        self.graph_decode_wrappers = {}
        self.graph_seq_lens = torch.ones(max_batch_size, dtype=torch.int32, device=dev)
        self.graph_slot_mapping = torch.full((max_batch_size,), PAD_SLOT_ID, dtype=torch.long, device=dev)
        self.graph_block_tables = torch.from_numpy(self.runner.graph_block_tables).to(device=dev)
        self.graph_block_table_bound = torch.ones(max_batch_size, dtype=torch.int32, device=dev)
        self.graph_kv_indptr = torch.zeros(max_batch_size + 1, dtype=torch.int32, device=dev)
        self.graph_kv_indices = torch.zeros(
            max_batch_size * self.runner.graph_block_tables.shape[1], dtype=torch.int32, device=dev
        )
        self.graph_kv_last_page_len = torch.ones(max_batch_size, dtype=torch.int32, device=dev)
        try:
            yield
        finally:
            self._is_graph_capturing = False

    def graph_capture_get_metadata_for_batch(self, batch_size: int) -> "FlashInferMetadata":
        r = self.runner
        ws = torch.empty(self._graph_ws_bytes(batch_size), dtype=torch.uint8, device=r.device)  # ok: FC105
        w = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            ws,
            self.graph_kv_indptr[: batch_size + 1],
            self.graph_kv_indices,
            self.graph_kv_last_page_len[:batch_size],
            "NHD",
            self._use_tensor_cores(),
        )
        self.graph_kv_last_page_len[:batch_size].fill_(1)  # ok: FC104
        indptr_cpu = torch.arange(batch_size + 1, dtype=torch.int32)
        last_cpu = torch.ones(batch_size, dtype=torch.int32)
        w.plan(  # ok: FC102
            indptr_cpu,
            self.graph_kv_indices[:batch_size],
            last_cpu,
            r.num_heads,
            r.num_kv_heads,
            r.head_dim,
            r.block_size,
            data_type=r.kv_cache_dtype,
        )
        self.graph_decode_wrappers[batch_size] = w
        return FlashInferMetadata(
            num_prefills=0,
            num_prefill_tokens=0,
            num_decode_tokens=batch_size,
            slot_mapping=self.graph_slot_mapping[:batch_size],
            seq_lens_tensor=self.graph_seq_lens[:batch_size],
            seq_lens_np=np.ones(batch_size, dtype=np.int32),
            max_decode_seq_len=1,
            block_tables=self.graph_block_tables[:batch_size],
            block_table_bound=self.graph_block_table_bound[:batch_size],
            query_start_loc=None,
            paged_kv_indptr=self.graph_kv_indptr[: batch_size + 1],
            paged_kv_indices=self.graph_kv_indices,
            paged_kv_last_page_len=self.graph_kv_last_page_len[:batch_size],
            paged_kv_indptr_cpu=indptr_cpu,
            decode_kv_indptr_cpu=indptr_cpu,
            paged_kv_last_page_len_cpu=last_cpu,
            num_qo_heads=r.num_heads,
            num_kv_heads=r.num_kv_heads,
            head_dim=r.head_dim,
            page_size=r.block_size,
            sliding_window=r.sliding_window,
            decode_wrapper=w,
            window_decode_wrapper=self.get_window_decode_wrapper(),
            trtllm_workspace=self.get_trtllm_workspace() if r.use_trtllm_decode else None,
            use_trtllm_decode=r.use_trtllm_decode,
        )

    def jit_ready(self) -> bool:
        return all(getattr(w, "_cached_module", None) is not None for w in self.graph_decode_wrappers.values())  # expect: FC103

    def memory_report(self) -> dict:
        graph_ws = sum(vars(w)["_int_workspace_buffer"].numel() for w in self.graph_decode_wrappers.values())  # expect: FC103
        own = self._float_workspace_buffer.numel() if self._float_workspace_buffer is not None else 0  # ok: FC103
        return {"decode_workspace": own, "graph_int_workspaces": graph_ws}


@dataclass
class FlashInferMetadata:
    num_prefills: int
    num_prefill_tokens: int
    num_decode_tokens: int
    slot_mapping: torch.Tensor
    seq_lens_tensor: torch.Tensor
    seq_lens_np: np.ndarray
    max_decode_seq_len: int
    block_tables: torch.Tensor
    block_table_bound: Optional[torch.Tensor]
    query_start_loc: Optional[torch.Tensor]
    paged_kv_indptr: Optional[torch.Tensor]
    paged_kv_indices: Optional[torch.Tensor]
    paged_kv_last_page_len: Optional[torch.Tensor]
    paged_kv_indptr_cpu: torch.Tensor
    decode_kv_indptr_cpu: torch.Tensor
    paged_kv_last_page_len_cpu: torch.Tensor
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    sliding_window: Optional[int] = None
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
    decode_wrapper: Any = None
    window_decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    trtllm_workspace: Optional[torch.Tensor] = None
    use_trtllm_decode: bool = False

    def begin_forward(self) -> None:
        np_ = self.num_prefills
        if self.num_prefill_tokens > 0:
            self.prefill_wrapper.plan(  # expect: FC102
                self.query_start_loc[: np_ + 1],
                self.paged_kv_indptr_cpu[: np_ + 1],
                self.paged_kv_indices,
                self.paged_kv_last_page_len_cpu[:np_],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                causal=True,
            )
        if self.num_decode_tokens > 0 and not self.use_trtllm_decode:
            self.decode_wrapper.plan(  # ok: FC102
                self.decode_kv_indptr_cpu,
                self.paged_kv_indices,
                self.paged_kv_last_page_len_cpu[np_:],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
            )
            if self.sliding_window is not None:
                self.window_decode_wrapper.plan(
                    self.decode_kv_indptr_cpu,
                    self.paged_kv_indices,
                    self.paged_kv_last_page_len_cpu[np_:],
                    self.num_qo_heads,
                    self.num_kv_heads,
                    self.head_dim,
                    self.page_size,
                    window_left=self.sliding_window - 1,
                )

    def _advance_host_mirrors(self, block_size: int, num_queries: int) -> None:
        seq = self.seq_lens_np
        seq[:num_queries] += 1
        pages = (seq[:num_queries] + block_size - 1) // block_size
        np.cumsum(pages, out=self.decode_kv_indptr_cpu.numpy()[1 : num_queries + 1])
        self.paged_kv_last_page_len_cpu.numpy()[:num_queries] = (seq[:num_queries] - 1) % block_size + 1

    def advance_step(self, model_input, sampled_token_ids: torch.Tensor, block_size: int, num_seqs: int, num_queries: int) -> None:
        assert self.num_prefills == 0, "multi-step advances decode-only batches"  # ok: FC109
        assert self.num_decode_tokens == num_seqs  # expect: FC109
        assert self.paged_kv_indices is not None  # ok: FC109
        advance_step_flashinfer(  # ok: FC104
            num_seqs=num_seqs,
            num_queries=num_queries,
            block_size=block_size,
            input_tokens=model_input.input_tokens,
            sampled_token_ids=sampled_token_ids,
            input_positions=model_input.input_positions,
            seq_lens=self.seq_lens_tensor,
            slot_mapping=self.slot_mapping,
            block_tables=self.block_tables,
            paged_kv_indices=self.paged_kv_indices,
            paged_kv_indptr=self.paged_kv_indptr,
            paged_kv_last_page_len=self.paged_kv_last_page_len,
            block_table_bound=self.block_table_bound,
        )
        self._advance_host_mirrors(block_size, num_queries)
        self.max_decode_seq_len = int(self.seq_lens_tensor.max())  # expect: FC101
        self.begin_forward()
        # rows past num_queries pad the captured batch size: keep them on one token of page 0
        self.paged_kv_last_page_len[num_queries:num_seqs].fill_(1)  # expect: FC104


class FlashInferMetadataBuilder:
    def __init__(self, runner: "GPUModelRunner"):
        self.runner = runner

    def build(
        self,
        seq_lens: list,
        query_lens: list,
        block_tables: list,
        num_prefills: int,
        graph_bs: Optional[int] = None,
    ) -> FlashInferMetadata:
        r = self.runner
        st = r.attn_state
        device = r.device
        page = r.block_size
        n = len(seq_lens)
        seq_lens_np = np.asarray(seq_lens, dtype=np.int32)
        query_lens_np = np.asarray(query_lens, dtype=np.int32)
        num_tokens = int(query_lens_np.sum())
        num_prefill_tokens = int(query_lens_np[:num_prefills].sum())
        max_decode_seq_len = int(seq_lens_np[num_prefills:].max()) if n > num_prefills else 0  # ok: FC101

        pages = (seq_lens_np + page - 1) // page
        indptr_np = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr_np[1:])
        last_np = ((seq_lens_np - 1) % page + 1).astype(np.int32)
        indices_np = np.concatenate([np.asarray(bt[:k], dtype=np.int32) for bt, k in zip(block_tables, pages)])
        qsl_np = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(query_lens_np, out=qsl_np[1:])
        decode_indptr_np = indptr_np[num_prefills:] - indptr_np[num_prefills]
        num_decode_rows = n - num_prefills
        if graph_bs is not None and graph_bs > n:
            # pad the captured batch: padded rows read one token of page 0
            decode_indptr_np = np.concatenate([decode_indptr_np, np.full(graph_bs - n, decode_indptr_np[-1])])
            last_np = np.concatenate([last_np, np.ones(graph_bs - n, dtype=np.int32)])
            num_decode_rows = graph_bs

        query_start_loc = torch.from_numpy(qsl_np).to(device, non_blocking=True)
        query_lens_gpu = torch.from_numpy(query_lens_np).to(device, non_blocking=True)
        token_to_seq = torch.repeat_interleave(  # ok: FC101
            torch.arange(n, device=device), query_lens_gpu, output_size=num_tokens
        )
        positions_in_seq = torch.arange(num_tokens, device=device) - query_start_loc[token_to_seq]
        bt_np = np.zeros((n, max(int(pages.max()) if n else 1, 1)), dtype=np.int32)
        for i, (bt, k) in enumerate(zip(block_tables, pages)):
            bt_np[i, :k] = bt[:k]
        block_tables_gpu = torch.from_numpy(bt_np).to(device, non_blocking=True)
        start = torch.from_numpy(seq_lens_np - query_lens_np).to(device, non_blocking=True)
        pos = start[token_to_seq] + positions_in_seq
        slot_mapping = block_tables_gpu[token_to_seq, pos // page] * page + pos % page
        indices_gpu = torch.from_numpy(indices_np).to(device, non_blocking=True)

        if graph_bs is not None:
            nnz = indices_np.shape[0]
            st.graph_kv_indices[:nnz].copy_(indices_gpu, non_blocking=True)  # ok: FC104
            st.graph_seq_lens[:n].copy_(torch.from_numpy(seq_lens_np), non_blocking=True)
            st.graph_block_table_bound[:n].copy_(torch.from_numpy(pages.astype(np.int32)), non_blocking=True)
            paged_kv_indices = st.graph_kv_indices
            paged_kv_indptr = st.graph_kv_indptr[: graph_bs + 1]
            paged_kv_last_page_len = st.graph_kv_last_page_len[:graph_bs]
            seq_lens_tensor = st.graph_seq_lens[:graph_bs]
            block_table_bound = st.graph_block_table_bound[:graph_bs]
            decode_wrapper = st.graph_decode_wrappers[graph_bs]
        else:
            paged_kv_indices = indices_gpu
            paged_kv_indptr = torch.from_numpy(indptr_np).to(device, non_blocking=True)
            paged_kv_last_page_len = torch.from_numpy(last_np).to(device, non_blocking=True)
            seq_lens_tensor = torch.from_numpy(seq_lens_np).to(device, non_blocking=True)
            block_table_bound = torch.from_numpy(pages.astype(np.int32)).to(device, non_blocking=True)
            decode_wrapper = st.get_decode_wrapper()

        md = FlashInferMetadata(
            num_prefills=num_prefills,
            num_prefill_tokens=num_prefill_tokens,
            num_decode_tokens=num_decode_rows,
            slot_mapping=slot_mapping,
            seq_lens_tensor=seq_lens_tensor,
            seq_lens_np=seq_lens_np.copy(),
            max_decode_seq_len=max_decode_seq_len,
            block_tables=block_tables_gpu,
            block_table_bound=block_table_bound,
            query_start_loc=query_start_loc,
            paged_kv_indptr=paged_kv_indptr,
            paged_kv_indices=paged_kv_indices,
            paged_kv_last_page_len=paged_kv_last_page_len,
            paged_kv_indptr_cpu=torch.from_numpy(indptr_np).pin_memory(),
            decode_kv_indptr_cpu=torch.from_numpy(decode_indptr_np.astype(np.int32)).pin_memory(),
            paged_kv_last_page_len_cpu=torch.from_numpy(last_np).pin_memory(),
            num_qo_heads=r.num_heads,
            num_kv_heads=r.num_kv_heads,
            head_dim=r.head_dim,
            page_size=page,
            sliding_window=r.sliding_window,
            prefill_wrapper=st.get_prefill_wrapper() if num_prefills else None,
            decode_wrapper=decode_wrapper,
            window_decode_wrapper=st.get_window_decode_wrapper(),
            trtllm_workspace=st.get_trtllm_workspace() if r.use_trtllm_decode else None,
            use_trtllm_decode=r.use_trtllm_decode,
        )
        md.begin_forward()
        return md


class FlashInferImpl:
    def __init__(self, num_heads: int, head_dim: int, scale: float, sliding_window: Optional[int]):
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        self.sliding_window = sliding_window

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor, md: FlashInferMetadata) -> torch.Tensor:
        return md.prefill_wrapper.run(q, kv_cache)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, md: FlashInferMetadata) -> torch.Tensor:
        if md.use_trtllm_decode:
            return trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv_cache,
                workspace_buffer=md.trtllm_workspace,
                block_tables=md.block_tables,
                seq_lens=md.seq_lens_tensor,
                max_seq_len=md.max_decode_seq_len,
                bmm1_scale=self.scale,
                bmm2_scale=1.0,
            )
        if self.sliding_window is not None:
            return md.window_decode_wrapper.run(q, kv_cache)  # expect: FC108
        return md.decode_wrapper.run(q, kv_cache)  # ok: FC108
