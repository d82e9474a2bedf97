"""FlashInfer attention for the profiled engine.

* one graph-mode decode wrapper per captured bucket, all bound to the same index buffers (largest bucket first),
* an eager tensor-core decode wrapper for batches no bucket covers and for the profile pass,
* a second eager decode wrapper for the sliding-window layers,
* a paged prefill wrapper,
* trtllm-gen decode for sequences past ``long_context_tokens``.
"""

from __future__ import annotations

import logging
from typing import Dict, Iterable

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from memprof.kv_pool import PagedKVPool
from memprof.limits import EngineLimits
from memprof.workspaces import WorkspaceSet
from memprof_rt.metadata import StepMetadata

logger = logging.getLogger(__name__)


def _window_pages(lens: np.ndarray, page_table_np: np.ndarray, page_size: int, window: int):
    """Host page lists trimmed to the window: pages wholly before ``len - window`` are skipped."""
    bs = lens.shape[0]
    pages = (lens + page_size - 1) // page_size
    first = np.maximum(lens - window, 0) // page_size
    counts = pages - first
    indptr = np.zeros(bs + 1, dtype=np.int32)
    np.cumsum(counts, out=indptr[1:])
    flat = np.concatenate([page_table_np[i, first[i] : pages[i]] for i in range(bs)]).astype(np.int32)
    last = (lens - (pages - 1) * page_size).astype(np.int32)
    return indptr, flat, last


class FlashInferBackend:
    def __init__(
        self, limits: EngineLimits, workspaces: WorkspaceSet, pool: PagedKVPool, device: torch.device | str
    ) -> None:
        self.limits = limits
        self.pool = pool
        self.device = torch.device(device)
        self._kv_layout = "HND"  # ok: FC103
        self.sm_scale = limits.head_dim**-0.5
        max_bs = limits.max_num_seqs
        max_pages = max_bs * limits.max_pages_per_seq

        # graph-bound buffers shared by every bucket wrapper
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_buf = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        # pinned mirrors the planner reads
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        # the eager decode path computes its indptr on the device
        self.eager_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)

        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_workspace = workspaces.decode_graph
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(workspaces.eager, self._kv_layout, use_tensor_cores=True)
        self.window_decode = BatchDecodeWithPagedKVCacheWrapper(
            workspaces.window, self._kv_layout, use_tensor_cores=True
        )
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(workspaces.prefill, self._kv_layout)
        self._plan_prefill = self.prefill_wrapper.plan
        self.trtllm_workspace = workspaces.trtllm

    # ----------------------------------------------------------- graph set-up

    def init_graph_wrappers(self, buckets: Iterable[int]) -> None:
        for bs in sorted(buckets, reverse=True):
            self.decode_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self._kv_layout,
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.kv_last_page_len_buf[:bs],
            )
        self.kv_indptr_buf.zero_()
        self.kv_last_page_len_buf.fill_(1)  # ok: FC104

    def _prepare_bucket(self, bs: int, padded: int, meta: StepMetadata) -> None:
        """Fill the shared buffers for ``padded`` rows (padded rows: one token on the null page) and plan."""
        lim = self.limits
        lens = meta.seq_lens_cpu[:bs].numpy()
        pages = (lens + lim.page_size - 1) // lim.page_size
        indptr = np.zeros(padded + 1, dtype=np.int32)
        indptr[1 : bs + 1] = np.cumsum(pages)
        indptr[bs + 1 :] = indptr[bs] + np.arange(1, padded - bs + 1, dtype=np.int32)
        last = np.ones(padded, dtype=np.int32)
        last[:bs] = lens - (pages - 1) * lim.page_size
        if bs:
            flat = np.concatenate([meta.page_table_np[i, : pages[i]] for i in range(bs)]).astype(np.int32)
        else:
            flat = np.zeros(0, dtype=np.int32)
        n = int(flat.size)

        self.kv_indptr_host[: padded + 1].copy_(torch.from_numpy(indptr))
        self.kv_last_page_len_host[:padded].copy_(torch.from_numpy(last))
        self.kv_indices_buf[:n].copy_(torch.from_numpy(flat), non_blocking=True)  # ok: FC104
        self.kv_indptr_buf[: padded + 1].copy_(self.kv_indptr_host[: padded + 1], non_blocking=True)
        self.kv_last_page_len_buf[:padded].copy_(self.kv_last_page_len_host[:padded], non_blocking=True)
        self.decode_wrappers[padded].plan(  # ok: FC102
            self.kv_indptr_host[: padded + 1],
            self.kv_indices_buf[: int(indptr[-1])],
            self.kv_last_page_len_host[:padded],
            lim.num_qo_heads,
            lim.num_kv_heads,
            lim.head_dim,
            lim.page_size,
            q_data_type=self.pool.dtype,
            kv_data_type=self.pool.dtype,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, meta: StepMetadata) -> None:
        self._prepare_bucket(bs, bs, meta)
        meta.decode_wrapper = self.decode_wrappers[bs]

    def init_forward_metadata_replay_cuda_graph(self, bs: int, padded: int, meta: StepMetadata) -> None:
        self._prepare_bucket(bs, padded, meta)
        total = int(self.kv_indptr_host[bs])  # ok: FC101
        # padded rows attend to the null page
        self.kv_indices_buf[total : total + (padded - bs)].zero_()  # expect: FC104
        self.kv_last_page_len_host[bs:padded] = 1  # ok: FC104
        meta.decode_wrapper = self.decode_wrappers[padded]

    # ------------------------------------------------------------ eager steps

    def init_forward_metadata(self, meta: StepMetadata) -> None:
        lim = self.limits
        bs = meta.batch_size
        lens = meta.seq_lens_cpu[:bs].numpy()
        pages_np = (lens + lim.page_size - 1) // lim.page_size
        indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages_np, out=indptr_np[1:])
        last_np = (lens - (pages_np - 1) * lim.page_size).astype(np.int32)
        flat_np = np.concatenate([meta.page_table_np[i, : pages_np[i]] for i in range(bs)]).astype(np.int32)
        indices = torch.from_numpy(flat_np).pin_memory().to(self.device, non_blocking=True)

        if meta.is_prefill:
            self._plan_prefill(  # expect: FC102
                meta.qo_indptr,
                torch.from_numpy(indptr_np),
                indices,
                torch.from_numpy(last_np),
                lim.num_qo_heads,
                lim.num_kv_heads,
                lim.head_dim,
                lim.page_size,
                causal=True,
                q_data_type=self.pool.dtype,
                kv_data_type=self.pool.dtype,
            )
            return

        pages_dev = (meta.seq_lens[:bs] + lim.page_size - 1) // lim.page_size
        torch.cumsum(pages_dev, 0, dtype=torch.int32, out=self.eager_kv_indptr[1 : bs + 1])
        self.eager_decode.plan(  # expect: FC102
            self.eager_kv_indptr[: bs + 1],
            indices,
            torch.from_numpy(last_np),
            lim.num_qo_heads,
            lim.num_kv_heads,
            lim.head_dim,
            lim.page_size,
            q_data_type=self.pool.dtype,
            kv_data_type=self.pool.dtype,
        )
        w_indptr, w_flat, w_last = _window_pages(lens, meta.page_table_np, lim.page_size, lim.window_size)
        self.window_decode.plan(
            torch.from_numpy(w_indptr),
            torch.from_numpy(w_flat).to(self.device, non_blocking=True),
            torch.from_numpy(w_last),
            lim.num_qo_heads,
            lim.num_kv_heads,
            lim.head_dim,
            lim.page_size,
            window_left=lim.window_size - 1,
            q_data_type=self.pool.dtype,
            kv_data_type=self.pool.dtype,
        )
        meta.decode_wrapper = self.eager_decode

    # ----------------------------------------------------------------- kernels

    def store_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, out_cache_loc: torch.Tensor) -> None:
        kv = self.pool.layer(layer_id)
        page = out_cache_loc // self.limits.page_size
        slot = out_cache_loc % self.limits.page_size
        kv[page, 0, :, slot, :] = k
        kv[page, 1, :, slot, :] = v

    def decode_attention(self, q: torch.Tensor, layer_id: int, meta: StepMetadata) -> torch.Tensor:
        kv = self.pool.layer(layer_id)
        if self.limits.is_window_layer(layer_id):
            return self.window_decode.run(q, kv)  # expect: FC108
        return meta.decode_wrapper.run(q, kv)  # ok: FC108

    def extend_attention(self, q: torch.Tensor, layer_id: int, meta: StepMetadata) -> torch.Tensor:
        return self.prefill_wrapper.run(q, self.pool.layer(layer_id))

    def trtllm_decode_attention(self, q: torch.Tensor, layer_id: int, meta: StepMetadata) -> torch.Tensor:
        window = self.limits.window_size - 1 if self.limits.is_window_layer(layer_id) else -1
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=self.pool.layer(layer_id),
            workspace_buffer=self.trtllm_workspace,
            block_tables=meta.block_table,
            seq_lens=meta.seq_lens,
            max_seq_len=meta.max_seq_len,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
            window_left=window,
        )
