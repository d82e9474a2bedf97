"""FlashInfer backend: dense early layers, Quest top-k decode, block-sparse long prefill."""

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.sparse import BlockSparseAttentionWrapper, VariableBlockSparseAttentionWrapper

from quest.config import QuestConfig, WsSize
from quest.selector import TopKPageSelector
from quest.summaries import PageSummaryCache


@dataclass
class QuestBatch:
    bs: int
    rows_gpu: torch.Tensor
    req_pages: torch.Tensor          # [bs, max_pages] device page table rows
    page_counts_gpu: torch.Tensor
    page_counts_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor
    last_pages: torch.Tensor
    q_proxy: torch.Tensor            # previous step's query of the first sparse layer
    is_prefill: bool = False
    prompt_len: int = 0
    head_row_sizes_cpu: Optional[torch.Tensor] = None
    head_col_sizes_cpu: Optional[torch.Tensor] = None


class QuestAttnBackend:
    def __init__(self, cfg: QuestConfig, summaries: PageSummaryCache, selector: TopKPageSelector,
                 k_caches: List[torch.Tensor], device: torch.device):
        self.cfg = cfg
        self.summaries = summaries
        self.selector = selector
        self.k_caches = k_caches
        self.device = device
        self._kv_layout = "NHD"  # ok: FC103
        max_bs = cfg.max_batch_size
        self.bsr_workspace = torch.zeros(WsSize.SPARSE, dtype=torch.uint8, device=device)  # expect: FC106
        decode_ws_bytes = max_bs * cfg.num_qo_heads * cfg.max_splits * (cfg.head_dim + 1) * 4
        self.decode_workspace = torch.empty(decode_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.bsr_wrapper = BlockSparseAttentionWrapper(self.bsr_workspace)
        self.vbs_wrapper = VariableBlockSparseAttentionWrapper(self.bsr_workspace)
        self.dense_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout, backend="fa2")
        self.sparse_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout, backend="fa2")
        self.trtllm_workspace = None
        if cfg.use_trtllm_dense:
            self.trtllm_workspace = torch.zeros(decode_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        k = selector.k_pages
        self.sel_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.sel_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.sel_indices = torch.zeros(max_bs * k, dtype=torch.int32, device=device)
        self.dense_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.dense_indices = torch.zeros(max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.graph_sparse_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.in_graph_mode = False
        self.dense_seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.row_k_cpu: Optional[torch.Tensor] = None

    # ---- graph state -------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int) -> None:
        k = self.selector.k_pages
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * k, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        k = self.selector.k_pages
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace,
            self._kv_layout,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.cuda_graph_last_page_len[:bs],
            backend="fa2",
        )
        self.cuda_graph_kv_indices[: bs * k].fill_(0)  # ok: FC104
        self.sel_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32) * k
        self.sel_last_page_len_cpu[:bs] = self.cfg.page_size
        w.plan(
            self.sel_indptr_cpu[: bs + 1],
            self.cuda_graph_kv_indices,
            self.sel_last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=torch.bfloat16,
        )
        self.graph_sparse_decode[bs] = w
        self.in_graph_mode = True

    # ---- per step ----------------------------------------------------------

    def _selected_indptr(self, batch: QuestBatch) -> int:
        bs = batch.bs
        counts = batch.page_counts_cpu[:bs].tolist()  # ok: FC101
        k = self.selector.k_pages
        self.row_k_cpu = torch.tensor([min(k, c) for c in counts], dtype=torch.int32)  # ok: FC107
        self.sel_indptr_cpu[0] = 0
        self.sel_indptr_cpu[1 : bs + 1] = torch.cumsum(self.row_k_cpu[:bs], 0)
        self.sel_last_page_len_cpu[:bs] = batch.last_page_len_cpu[:bs]
        return max(counts)  # ok: FC101

    def _pack_selection(self, sel: torch.Tensor, bs: int, out: torch.Tensor) -> None:
        # rows shorter than k keep their first row_k entries (the selection is sorted by score)
        row_ids = torch.repeat_interleave(torch.arange(bs, dtype=torch.int64), self.row_k_cpu[:bs].long())
        starts = self.sel_indptr_cpu[:bs].long()[row_ids]
        cols = torch.arange(row_ids.numel(), dtype=torch.int64) - starts
        flat = row_ids.to(self.device, non_blocking=True) * sel.shape[1] + cols.to(self.device, non_blocking=True)
        torch.take(sel, flat, out=out[: row_ids.numel()])

    def init_forward_metadata(self, batch: QuestBatch) -> None:
        self.summaries.update_summaries(self.k_caches, batch.last_pages)
        if batch.is_prefill:
            self._plan_sparse_prefill(batch)
            return
        self._plan_dense(batch)
        self._selected_indptr(batch)
        sel = self.selector.select(self.summaries, self.cfg.dense_layers, batch.q_proxy, batch.req_pages,
                                   batch.page_counts_gpu, batch.bs)
        self._pack_selection(sel, batch.bs, self.sel_indices)
        self.sparse_decode.plan(
            self.sel_indptr_cpu[: batch.bs + 1],
            self.sel_indices,
            self.sel_last_page_len_cpu[: batch.bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=torch.bfloat16,
        )

    def _plan_dense(self, batch: QuestBatch) -> None:
        bs = batch.bs
        self.dense_indptr_cpu[1 : bs + 1] = torch.cumsum(batch.page_counts_cpu[:bs], 0)
        self.dense_decode.plan(
            self.dense_indptr_cpu[: bs + 1],
            self.dense_indices,
            batch.last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=torch.bfloat16,
        )

    def _plan_sparse_prefill(self, batch: QuestBatch) -> None:
        # sink + local block-sparse pattern for long prompts, one block row per query block
        blk = self.cfg.prefill_block
        mb = (batch.prompt_len + blk - 1) // blk
        indptr_np, indices_np = _sink_local_bsr(mb, self.cfg.sink_blocks, self.cfg.local_blocks)
        # the block-sparse kernel reads both on the device
        bsr_indptr = torch.from_numpy(indptr_np).to(self.device, non_blocking=True)
        bsr_indices = torch.from_numpy(indices_np).to(self.device, non_blocking=True)
        self.bsr_wrapper.plan(  # expect: FC102
            indptr=bsr_indptr,
            indices=bsr_indices,
            M=batch.prompt_len,
            N=batch.prompt_len,
            R=blk,
            C=blk,
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim=self.cfg.head_dim,
            q_data_type=torch.bfloat16,
        )
        if batch.head_row_sizes_cpu is not None:
            block_mask_map = self._head_block_mask(mb)
            self.vbs_wrapper.plan(  # ok: FC102
                block_mask_map=block_mask_map,
                block_row_sz=batch.head_row_sizes_cpu,
                block_col_sz=batch.head_col_sizes_cpu,
                num_qo_heads=self.cfg.num_qo_heads,
                num_kv_heads=self.cfg.num_kv_heads,
                head_dim=self.cfg.head_dim,
                q_data_type=torch.bfloat16,
            )

    def _head_block_mask(self, mb: int) -> torch.Tensor:
        tri = torch.ones(mb, mb, dtype=torch.bool, device=self.device).tril()
        return tri.unsqueeze(0).expand(self.cfg.num_kv_heads, mb, mb).contiguous()

    def init_forward_metadata_replay_cuda_graph(self, batch: QuestBatch, padded_bs: int) -> None:
        bs = batch.bs
        self.summaries.update_summaries(self.k_caches, batch.last_pages)
        self._plan_dense(batch)
        self._selected_indptr(batch)
        self.sel_indptr_cpu[bs + 1 : padded_bs + 1] = self.sel_indptr_cpu[bs]
        sel = self.selector.select(self.summaries, self.cfg.dense_layers, batch.q_proxy, batch.req_pages,
                                   batch.page_counts_gpu, bs)
        self._pack_selection(sel, bs, self.cuda_graph_kv_indices)  # ok: FC104
        self.graph_sparse_decode[padded_bs].plan(  # ok: FC102
            self.sel_indptr_cpu[: padded_bs + 1],
            self.cuda_graph_kv_indices,
            self.sel_last_page_len_cpu[:padded_bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=torch.bfloat16,
        )
        _pad_tail(self.cuda_graph_kv_indptr, bs, padded_bs)  # expect: FC104

    # ---- attention ---------------------------------------------------------

    def forward_decode(self, layer_id: int, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        if layer_id < self.cfg.dense_layers:
            if self.trtllm_workspace is not None:
                return trtllm_batch_decode_with_kv_cache(
                    q, kv_cache, self.trtllm_workspace, self.dense_indices.view(bs, -1),
                    self.dense_seq_lens[:bs], self.cfg.max_pages_per_req * self.cfg.page_size,
                )
            return self.dense_decode.run(q, kv_cache)  # expect: FC108
        w = self.graph_sparse_decode[bs] if self.in_graph_mode else self.sparse_decode
        return w.run(q, kv_cache)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.bsr_wrapper.run(q, k, v)


def _sink_local_bsr(mb: int, sink: int, local: int):
    indptr = np.zeros(mb + 1, dtype=np.int32)
    cols = []
    for r in range(mb):
        row = sorted(set(range(min(sink, r + 1))) | set(range(max(0, r - local + 1), r + 1)))
        cols.extend(row)
        indptr[r + 1] = indptr[r] + len(row)
    return indptr, np.asarray(cols, dtype=np.int32)


def _pad_tail(indptr: torch.Tensor, bs: int, padded_bs: int) -> None:
    # padded rows repeat the last offset: zero-length rows
    indptr[bs + 1 : padded_bs + 1] = indptr[bs]
