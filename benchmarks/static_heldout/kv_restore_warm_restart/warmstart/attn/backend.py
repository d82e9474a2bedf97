"""FlashInfer backend (SGLang-shaped) that survives a warm restart.

Rows resumed from a snapshot carry the restore generation they were loaded in; the backend
refreshes their device page-table rows, plans their pages like any other row, and attends over
pages the loader thread has not paged in yet through a staging wrapper merged by LSE.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state

from warmstart.config import RestartConfig
from warmstart.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from warmstart_rt.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class RestoreFlashInferBackend:
    def __init__(self, model_runner: "ModelRunner"):
        cfg = model_runner.cfg
        self.cfg = cfg
        self.device = model_runner.device
        self.pool = model_runner.kv_pool
        self.req_to_page = model_runner.req_to_page
        max_bs = cfg.max_num_reqs
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.page_counts_cpu = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        self.workspace_buffer = torch.empty(cfg.workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.graph_workspace = torch.empty(RestartConfig.GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, "NHD", use_tensor_cores=True)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, "NHD")
        self.staging_decode = BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, "NHD", use_tensor_cores=True)
        self.cuda_graph_kv_indices: Optional[torch.Tensor] = None
        self.decode_cuda_graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.active_decode = self.decode_wrapper
        self.restore_generation = 0
        self._metadata_generation = 0
        self._restored_last_page_len: Optional[torch.Tensor] = None

    def _dims(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def _host_page_layout(self, seq_lens_cpu: torch.Tensor, bs: int) -> np.ndarray:
        P = self.cfg.page_size
        seq = seq_lens_cpu[:bs].numpy()
        counts = self.page_counts_cpu.numpy()[:bs]
        np.floor_divide(seq + P - 1, P, out=counts, casting="unsafe")
        indptr = self.kv_indptr_cpu.numpy()
        indptr[0] = 0
        np.cumsum(counts, out=indptr[1 : bs + 1], dtype=np.int32)
        self.kv_last_page_len_cpu.numpy()[:bs] = (seq - 1) % P + 1
        return counts

    def _plan_staging(self, rows_cpu: torch.Tensor) -> None:
        H, KV, D, P = self._dims()
        indptr, indices, last = self.pool.staging_layout(rows_cpu.numpy())
        self.staging_decode.plan(
            torch.from_numpy(indptr), torch.from_numpy(indices), torch.from_numpy(last),
            H, KV, D, P, data_type=self.cfg.dtype,
        )

    def set_restored_last_page_len(self, values: torch.Tensor) -> None:
        if self._restored_last_page_len is None:
            self._restored_last_page_len = torch.ones(self.cfg.max_num_reqs, dtype=torch.int32, device=self.device)
        self._restored_last_page_len[: values.numel()].copy_(values)

    # -- eager steps -------------------------------------------------------------------------

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        if self._metadata_generation != self.restore_generation:
            # every row's pages moved in the restore: start from clean last-page lengths
            self.kv_last_page_len = torch.ones_like(self.kv_last_page_len)  # expect: FC107
            self._metadata_generation = self.restore_generation
        stale_rows = fb.req_pool_indices[fb.restore_gen < self.restore_generation]  # expect: FC101
        self.req_to_page.refresh_device_rows(stale_rows)
        max_len = int(fb.seq_lens_cpu.max())  # ok: FC101
        if max_len > self.cfg.max_pages_per_req * self.cfg.page_size:
            raise ValueError(f"sequence of {max_len} tokens exceeds the page table")
        self.page_counts_cpu = torch.zeros(self.cfg.max_num_reqs, dtype=torch.int32, pin_memory=True)  # ok: FC107
        counts = self._host_page_layout(fb.seq_lens_cpu, bs)
        kv_indices = self.req_to_page.gather_host(fb.req_pool_indices_cpu[:bs], counts).to(self.device, non_blocking=True)
        if fb.forward_mode == ForwardMode.DECODE:
            self.active_decode = self.decode_wrapper
            self._plan_decode_eager(bs, kv_indices)
            self._plan_staging(fb.req_pool_indices_cpu[:bs])
        else:
            self._plan_extend(fb, kv_indices)

    def _plan_decode_eager(self, bs: int, kv_indices: torch.Tensor) -> None:
        H, KV, D, P = self._dims()
        self.decode_wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], kv_indices, self.kv_last_page_len_cpu[:bs],
            H, KV, D, P, data_type=self.cfg.dtype,
        )

    def _plan_extend(self, fb: ForwardBatch, kv_indices: torch.Tensor) -> None:
        H, KV, D, P = self._dims()
        bs = fb.batch_size
        self.prefill_wrapper.plan(  # expect: FC102
            fb.extend_qo_indptr, self.kv_indptr_cpu[: bs + 1], kv_indices, self.kv_last_page_len_cpu[:bs],
            H, KV, D, P, causal=True,
        )

    # -- CUDA graphs -------------------------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int, max_num_pages: int) -> None:
        self.cuda_graph_kv_indices = torch.zeros(max_num_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices_cpu: torch.Tensor) -> None:
        H, KV, D, P = self._dims()
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        indptr_np = np.arange(bs + 1, dtype=np.int32)
        last_np = np.ones(bs, dtype=np.int32)
        w.plan(  # ok: FC102
            torch.from_numpy(indptr_np), self.cuda_graph_kv_indices[:bs], torch.from_numpy(last_np),
            H, KV, D, P, data_type=self.cfg.dtype,
        )
        self.decode_cuda_graph_wrappers[bs] = w
        self.active_decode = w
        self._plan_staging(req_pool_indices_cpu)

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        restore_gen: torch.Tensor,
    ) -> None:
        H, KV, D, P = self._dims()
        w = self.decode_cuda_graph_wrappers[bs]
        self.active_decode = w
        resumed_any = bool((restore_gen[:bs] < self.restore_generation).any())  # expect: FC101
        longest = max(seq_lens_cpu[i].item() for i in range(bs))  # ok: FC101
        if longest > self.cfg.max_pages_per_req * P:
            raise ValueError(f"row of {longest} tokens exceeds the page table")
        logger.debug("replay bs=%d seq_lens=%s", bs, seq_lens[:bs])  # ok: FC101
        counts = self._host_page_layout(seq_lens_cpu, bs)
        kv_indices = self.req_to_page.gather_host(req_pool_indices_cpu, counts)
        nnz = kv_indices.numel()
        self.cuda_graph_kv_indices[:nnz].copy_(kv_indices, non_blocking=True)  # ok: FC104
        w.plan(
            self.kv_indptr_cpu[: bs + 1], self.cuda_graph_kv_indices[:nnz], self.kv_last_page_len_cpu[:bs],
            H, KV, D, P, data_type=self.cfg.dtype,
        )
        self._plan_staging(req_pool_indices_cpu)
        if resumed_any:
            # resumed rows: their last page was persisted partially filled
            if self._restored_last_page_len is None:
                self._restored_last_page_len = torch.ones(self.cfg.max_num_reqs, dtype=torch.int32, device=self.device)  # ok: FC107
            self.kv_last_page_len[:bs].copy_(self._restored_last_page_len[:bs])  # expect: FC104

    # -- forward -----------------------------------------------------------------------------

    def forward_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch):
        self.pool.set_kv(layer_id, fb.out_cache_loc, k, v)
        o, lse = self.active_decode.run(q, self.pool.kv(layer_id), return_lse=True)  # ok: FC108
        o_stage, lse_stage = self.staging_decode.run(q, self.pool.staging_kv(layer_id), return_lse=True)  # expect: FC108
        merged, _ = merge_state(o, lse, o_stage, lse_stage)
        return merged

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch):
        self.pool.set_kv(layer_id, fb.out_cache_loc, k, v)
        return self.prefill_wrapper.run(q, self.pool.kv(layer_id))
